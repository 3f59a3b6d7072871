"""Elapsed device time: events on accelerators, ``time.perf_counter`` on the CPU."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampkit.device.layer import Device

__all__ = ["Timer"]


class Timer:
    """Measures elapsed device time between :meth:`start` and :meth:`stop` in seconds.

    On accelerators this records events and reads them in :meth:`elapsed` (one sync);
    on the CPU it uses ``time.perf_counter``.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self._events = None
        self._t0 = self._t1 = 0.0
        module = device.module
        if device.type in ("cuda", "musa", "xpu") and module is not None and hasattr(module, "Event"):
            self._events = (module.Event(enable_timing=True), module.Event(enable_timing=True))

    def start(self) -> "Timer":
        if self._events:
            self._events[0].record()
        else:
            self.device.synchronize()
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> "Timer":
        if self._events:
            self._events[1].record()
        else:
            self.device.synchronize()
            self._t1 = time.perf_counter()
        return self

    def elapsed(self) -> float:
        if self._events:
            self._events[1].synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return self._t1 - self._t0
