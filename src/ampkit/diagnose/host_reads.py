"""Host-sync detection in a diagnose run: device values read on the host every step.

:class:`HostReads` holds the wrappers that :class:`~ampkit.diagnose.instrument.Instrumentation`
installs around the host reads ``Tensor.item`` / ``tolist`` / ``__bool__`` / ``__float__`` /
``__int__``. It notes, per line of the user's code that calls one directly on an accelerator
tensor, the optimizer steps in which it ran; at the end of the run a line that ran in most steps
is reported as ``host-sync-per-step``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.compiler import is_compiling

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.tracking import frame_where

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["HostReads", "SYNC_NAMES"]

SYNC_NAMES = {"item": "`.item()`", "tolist": "`.tolist()`", "__bool__": "`bool(tensor)` (e.g. `if tensor:`)",
              "__float__": "`float(tensor)`", "__int__": "`int(tensor)`"}


def _is_accelerator_tensor(t: torch.Tensor) -> bool:
    """A host read of this tensor waits for the device (not on the CPU, where it is a plain read)."""
    return t.device.type not in ("cpu", "meta")


class HostReads:
    """The host reads of one run, by user line; ``inst`` is the run's
    :class:`~ampkit.diagnose.instrument.Instrumentation` (pause state, mode, step, findings)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._syncs: dict[str, tuple[str, set[int]]] = {}

    def wrap(self, name: str):
        """A patch maker for the ``torch.Tensor`` method ``name`` (a key of :data:`SYNC_NAMES`)."""
        inst, reads = self.inst, self

        def make(orig):
            def read(t, *args, **kwargs):
                if not is_compiling() and not inst._paused and inst.mode == "diagnose":
                    reads.note_sync(t, name)
                return orig(t, *args, **kwargs)

            read.__name__ = name
            return read

        return make

    def note_sync(self, t: torch.Tensor, name: str) -> None:
        frame = self.inst.user.caller_is_user(2)
        if frame is None or not _is_accelerator_tensor(t):
            return
        where = frame_where(frame)
        entry = self._syncs.setdefault(where, (name, set()))
        entry[1].add(self.inst.step)

    def finish(self) -> None:
        """Turn the reads seen in at least 80% of the steps (and at least 2) into findings."""
        inst = self.inst
        steps_seen = inst.step + 1
        needed = max(2, math.ceil(0.8 * steps_seen))
        for where, (name, steps) in self._syncs.items():
            if inst.step >= 1 and len(steps) >= needed:
                inst.add(Finding(
                    code="host-sync-per-step",
                    message=f"{SYNC_NAMES[name]} reads a device value on the host in {len(steps)} of {steps_seen} "
                            "steps: each one waits for the device to finish all queued work",
                    where=where, fix=fix_for("host-sync-per-step"), step=min(steps)))
