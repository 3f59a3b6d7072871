"""The steady-state optimizer step of a script, timed in the script's own process (``compare SCRIPT``).

Part of the diagnose runner (:mod:`ampkit.diagnose.script_run`): :class:`StepTimer` is called by the
:class:`~ampkit.diagnose.switch.Switch` at every optimizer step the script takes. On an accelerator it records a
device event on the current stream (no host synchronisation: the events are read once, when the run ends); on
the CPU, where every op has finished when the host moves on, it reads ``time.perf_counter``. The device is the
one the script's loss lives on, and the device layer gives its events and its peak memory (``None`` on the CPU).

What a user means by "step time" is the steady state: :func:`steady_ms` leaves out the first
:func:`warmup` intervals (compilation, autotuning, allocator warm-up) and takes the median of the rest, so that
an evaluation, a checkpoint or a recompilation between two steps (an interval far above the others) does not
move it unless it happens at most steps.

>>> steady_ms([900.0, 40.0] + [10.0] * 18 + [500.0])   # compile, warm-up, steady steps, one evaluation
10.0
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["StepTimer", "steady_ms", "warmup", "MAX_EVENTS"]

MAX_EVENTS = 100_000  # steps timed per run (the events are kept until the end)
MIN_STEADY = 3  # intervals needed after the warm-up for a steady-state figure


def warmup(intervals: int) -> int:
    """How many leading step intervals are left out: a tenth of them, at least 2."""
    return max(2, intervals // 10)


def steady_ms(step_ms: list[float] | None) -> float | None:
    """The median of the step intervals after :func:`warmup` (ms), or None with too few steps."""
    vals = [v for v in (step_ms or []) if v is not None and v >= 0]
    rest = vals[warmup(len(vals)):]
    return statistics.median(rest) if len(rest) >= MIN_STEADY else None


class StepTimer:
    """Marks every optimizer step; :meth:`result` reads the marks once (one synchronisation) at the end.
    ``switch`` (set after construction) gives the device of the losses the script passed to backward."""

    def __init__(self) -> None:
        self.switch: Any = None
        self.device: Any = None  # ampkit.device.Device, from the first step's loss
        self._event = None  # the device's Event class, or None: perf_counter
        self._marks: list[Any] = []

    def _start(self) -> None:
        import torch

        from ampkit.device import parse_device

        loss = next((t for t in reversed(getattr(self.switch, "losses", []) or []) if isinstance(t, torch.Tensor)),
                    None)
        where = loss.device if loss is not None else torch.device("cpu")
        try:
            self.device = parse_device(str(where))
        except Exception:  # noqa: BLE001 - a device the layer does not know: time it on the host
            self.device = parse_device("cpu")
        module = self.device.module
        if self.device.is_accelerator and module is not None and hasattr(module, "Event"):
            self._event = module.Event
            self.device.reset_peak_memory_stats()  # the set-up before the first step is not the training step

    def on_step(self, step: int) -> None:
        if self.device is None:
            self._start()
        if len(self._marks) >= MAX_EVENTS:
            return
        if self._event is not None:
            ev = self._event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def result(self) -> dict[str, Any]:
        """``{"device", "step_ms" (each interval between two steps), "peak_bytes"}``: the one host read."""
        if self.device is None or len(self._marks) < 2:
            return {"device": None if self.device is None else self.device.type, "step_ms": [], "peak_bytes": None}
        if self._event is not None:
            try:
                self._marks[-1].synchronize()
                ms = [a.elapsed_time(b) for a, b in zip(self._marks, self._marks[1:])]
            except RuntimeError:  # the script left the device unusable (its own error is the run's result)
                return {"device": self.device.type, "step_ms": [], "peak_bytes": None}
        else:
            ms = [(b - a) * 1e3 for a, b in zip(self._marks, self._marks[1:])]
        return {"device": self.device.type, "step_ms": ms, "peak_bytes": self.device.max_memory_allocated()}
