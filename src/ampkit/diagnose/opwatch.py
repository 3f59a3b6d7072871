"""Op-level watch inside module forwards: overflow that a module absorbs, and intermediate magnitudes.

A module's output can be finite although an op inside it overflowed: a hand-written normalisation
``x / sqrt(mean((300 * x) ** 2))`` squares to inf in FP16, ``x / inf`` gives 0, the loss stays finite and
the GradScaler never skips. Module hooks cannot see that; :class:`OpWatch`, a
:class:`~torch.utils._python_dispatch.TorchDispatchMode`, sees every aten op between a root module's
forward pre-hook and its forward hook (the instrumentation pushes it there and pops it after; it is
never active during backward, outside modules, or inside a ``torch.compile``d forward) and
attributes each op to the innermost module running (:class:`Frame`).

* ``diagnose`` mode: each FP16/BF16 op output is kept until the step's flush
  (:meth:`OpWatch.take_flags`), which checks them with the module outputs in a few fused
  ``_foreach_norm`` kernels and one transfer: no kernel and no host read per op.
* ``range`` mode (the FP32 run of ``--fp16-range``): per (module, op) the largest magnitude of the
  op's output, kept on the device, for the ops whose output the AMP run holds in FP16 (autocast's own
  casting rules, followed by :class:`~ampkit.diagnose.amp_dtypes.AmpDtypes`); :meth:`OpWatch.take_maxima`
  hands them to the range recorder.

View and alias ops (``t``, ``view``, ``detach``) are skipped: they cannot create a new value.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.diagnose.amp_dtypes import AmpDtypes

__all__ = ["OpWatch", "Frame", "OpFlag"]

_LOW = (torch.float16, torch.bfloat16)
# Ops that copy a value another op just produced (a reshape of a matmul's output): not a new value.
_COPIES = frozenset({"aten._unsafe_view", "aten.clone", "aten.contiguous", "aten._reshape_alias", "aten.lift_fresh"})


class Frame:
    """One module forward call while the watch is active; ``call`` is the locator's record of it
    (filled in by the forward hook, None when the forward raised)."""

    __slots__ = ("module", "call", "suspended")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.call: Any = None
        self.suspended = False  # a compiled module: the mode is off during its forward


class OpFlag:
    """One watched op output (diagnose mode): the flush checks ``tensor`` with all others at once."""

    __slots__ = ("tensor", "op", "dtype", "frame")

    def __init__(self, tensor: torch.Tensor, op: str, dtype: torch.dtype, frame: Frame) -> None:
        self.tensor, self.op, self.dtype, self.frame = tensor, op, dtype, frame


class OpWatch(TorchDispatchMode):
    """Watches aten op outputs inside module forwards. ``name`` names a module (range mode keys);
    ``paused()`` is true while ampkit itself runs ops (its hooks), which are not watched."""

    def __init__(self, mode: str, name: Callable[[torch.nn.Module], str], paused: Callable[[], bool]) -> None:
        super().__init__()
        self.mode = mode
        self.name = name
        self.paused = paused  # ampkit's own work (hooks, re-runs): not the user's ops
        self.stack: list[Frame] = []
        self.active = False
        self._flags: list[OpFlag] = []
        self._maxima: dict[tuple[str, str], torch.Tensor] = {}
        self.amp = AmpDtypes() if mode == "range" else None  # range: the dtype each value has in the FP16 run

    # ------------------------------------------------------------------ frames
    def push(self, module: torch.nn.Module) -> Frame:
        frame = Frame(module)
        self.stack.append(frame)
        return frame

    def pop(self) -> Frame | None:
        return self.stack.pop() if self.stack else None

    # ------------------------------------------------------------------ the mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.stack or self.paused():
            return out
        if self.amp is not None:
            self.amp.note(func, args, kwargs, out)
        if func.is_view:
            return out
        frame = self.stack[-1]
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            self._watch(func, out, frame)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._watch(func, t, frame)
        return out

    def _watch(self, func, t: torch.Tensor, frame: Frame) -> None:
        if not t.is_floating_point() or t.numel() == 0:
            return
        name = _op_name(func)
        if name in _COPIES:
            return
        if self.mode == "diagnose":
            if t.dtype in _LOW:
                self._flags.append(OpFlag(t.detach(), name, t.dtype, frame))
            return
        if self.amp is not None and not self.amp.is_low(t):
            return  # FP32 in the AMP run too (autocast keeps the op in FP32, or promotes it): no FP16 range
        key = (self.name(frame.module), name)
        m = t.detach().abs().amax().float()
        prev = self._maxima.get(key)
        self._maxima[key] = m if prev is None else torch.maximum(prev, m.to(prev.device))

    # ------------------------------------------------------------------ results
    def take_flags(self) -> list[OpFlag]:
        flags, self._flags = self._flags, []
        return flags

    def take_maxima(self) -> dict[tuple[str, str], torch.Tensor]:
        maxima, self._maxima = self._maxima, {}
        return maxima


def _op_name(func) -> str:
    """``aten.pow`` (the overload dropped: people read the op, not its schema variant)."""
    text = str(func)
    return text.rsplit(".", 1)[0] if text.count(".") >= 2 else text
