"""Gradients clipped by the script's own code while still multiplied by the loss scale, measured.

``torch.nn.utils.clip_grad_norm_`` is wrapped (:mod:`~ampkit.diagnose.scaler_checks`), but many repositories
clip by hand (DINO's per-parameter ``clip_gradients``: ``p.grad.data.mul_(clip / norm)``). Between a
backward whose loss an enabled GradScaler scaled and the ``unscale_`` / ``scaler.step`` that follows,
:class:`ClipWatch` keeps each gradient's norm and watches, with a
:class:`~torch.utils._python_dispatch.TorchDispatchMode`, the ops that write into a gradient's storage.
At the ``unscale_`` / ``step`` it measures: the gradients written in that window whose norm shrank, the
norm they were brought to (the clip threshold the code applied), and their norm divided by the scale (what
the same clip would have compared after ``unscale_``). ``clip-before-unscale`` is reported only when

* the shrunk gradients were brought to one common norm (a per-parameter clip: different norms before,
  the same after), or to one common largest element (a clip by value, VITS' ``clamp_``: the threshold is
  compared with the largest elements), or, for a clip of the total norm (one factor for all), the total was brought to the
  same value on two steps whose norms differed before (dividing gradients by a constant, such as a world
  size, keeps the ratio instead and is never reported); and
* the threshold is at least the unscaled norm for some of them: those would not have been clipped at
  all had the clip run after ``unscale_``.

The finding names the line of the loop (the frame that called ``backward``) whose call wrote the gradients.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.diagnose.findings import Finding
from ampkit.diagnose.tracking import short_path

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["ClipWatch"]

_SAME = 1e-3     # relative: norms this close are "the same" (a threshold)
_SHRUNK = 0.999  # a gradient whose norm fell below this share of its norm after backward was scaled down


class _GradWrites(TorchDispatchMode):
    """Records the first user line (in ``loop_code``'s frame when it is on the stack) of each op that writes
    into one of ``storages``."""

    def __init__(self, storages: dict[int, int], loop_code, user) -> None:
        super().__init__()
        self.storages, self.loop_code, self.user = storages, loop_code, user
        self.written: dict[int, str] = {}  # index of the parameter -> the line that wrote its gradient

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = getattr(func, "_schema", None)
        for arg, value in zip(schema.arguments if schema is not None else (), args):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    index = self.storages.get(t.untyped_storage().data_ptr())
                    if index is not None and index not in self.written:
                        self.written[index] = self._line()
        return out

    def _line(self) -> str:
        f = sys._getframe(2)
        inner = None
        while f is not None:
            if self.loop_code is not None and f.f_code is self.loop_code:
                return f"{short_path(f.f_code.co_filename)}:{f.f_lineno}"
            if inner is None and self.user.is_user_file(f.f_code.co_filename):
                inner = f"{short_path(f.f_code.co_filename)}:{f.f_lineno}"
            f = f.f_back
        return inner or "(not in the script's code)"


class ClipWatch:
    """See the module docstring; ``inst`` is the run's :class:`~ampkit.diagnose.instrument.Instrumentation`."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._mode: _GradWrites | None = None
        self._params: list[torch.Tensor] = []
        self._norms: list[float] = []
        self._peaks: list[float] = []  # the largest |element| of each gradient after the backward
        self._totals: list[tuple[float, float]] = []  # (before, after) of earlier steps' uniform shrinks

    def stop(self) -> None:
        """Pop the watch (a backward starts, or the run ends)."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def after_backward(self, frame) -> None:
        """A backward ended: when an enabled scaler scaled its loss, keep the gradients' norms and watch writes."""
        inst = self.inst
        self.stop()
        if inst.has("clip-before-unscale") or inst.scaler_checks.pending_scale() <= 1.0:
            return
        params = [p for o in list(inst._optimizers) for g in o.param_groups for p in g["params"]
                  if p.grad is not None and p.grad.is_floating_point()]
        if not params:
            return
        with inst.paused(), torch.no_grad():
            self._norms, self._peaks = _norms_and_peaks([p.grad for p in params])
        self._params = params
        storages = {p.grad.untyped_storage().data_ptr(): i for i, p in enumerate(params)}
        self._mode = _GradWrites(storages, frame.f_code if frame is not None else None, inst.user)
        self._mode.__enter__()

    def check(self) -> None:
        """At ``unscale_`` / ``scaler.step``: measure what the writes since the backward did (module docstring)."""
        mode = self._mode
        self.stop()
        inst = self.inst
        scale = inst.scaler_checks.pending_scale()
        if mode is None or not mode.written or scale <= 1.0 or inst.has("clip-before-unscale"):
            return
        index = [i for i in mode.written if self._params[i].grad is not None]
        if not index:
            return
        with inst.paused(), torch.no_grad():
            after, peaks = _norms_and_peaks([self._params[i].grad for i in index])
        before = [self._norms[i] for i in index]
        shrunk = [(b, a, mode.written[i]) for i, b, a in zip(index, before, after) if b > 0 and a < _SHRUNK * b]
        if not shrunk:
            return
        cut = [(self._peaks[i], p) for i, b, a, p in zip(index, before, after, peaks) if b > 0 and a < _SHRUNK * b]
        ratios = [a / b for b, a, _ in shrunk]
        afters = [a for _, a, _ in shrunk]
        if len(shrunk) >= 2 and max(ratios) - min(ratios) > _SAME * max(ratios) \
                and max(afters) - min(afters) > _SAME * max(afters):
            tops = [p for _, p in cut]
            if max(tops) - min(tops) > _SAME * max(tops):
                return  # neither one threshold (of norm or value) nor one factor: not a clip
            threshold = max(tops)
            spared = [b for b, _ in cut if b / scale <= threshold]
            what = (f"{len(cut)} gradients had their elements clamped to +-{threshold:.4g} (a clip by value); their "
                    f"largest elements then were {min(b for b, _ in cut):.4g} to {max(b for b, _ in cut):.4g}, still "
                    f"multiplied by the loss scale {scale:g}; {len(spared)} of them, unscaled, are below the threshold "
                    "and would not have been clipped at all")
            hidden = sum(not math.isfinite(b) for b, _ in cut)
            if hidden:
                what += (f"; {hidden} held inf/NaN, which the clamp made finite: the GradScaler no longer sees the "
                         "overflow and does not skip the step")
        elif len(shrunk) >= 2 and max(ratios) - min(ratios) > _SAME * max(ratios):
            threshold = max(afters)
            spared = [b for b, _, _ in shrunk if b / scale <= threshold]
            what = (f"{len(shrunk)} gradients were each scaled down to the norm {threshold:.4g} (a per-parameter clip "
                    f"threshold); their norms then were {min(b for b, _, _ in shrunk):.4g} to "
                    f"{max(b for b, _, _ in shrunk):.4g}, still multiplied by the loss scale {scale:g}; "
                    f"{len(spared)} of them, unscaled, are below the threshold and would not have been clipped at all")
        else:
            total_before = sum(b * b for b, _, _ in shrunk) ** 0.5
            total_after = sum(a * a for _, a, _ in shrunk) ** 0.5
            same = [t for t in self._totals if abs(t[1] - total_after) <= _SAME * total_after
                    and abs(t[0] - total_before) > _SAME * total_before]
            self._totals.append((total_before, total_after))
            if not same:
                return  # one step's uniform shrink: a clip or a division by a constant, not yet told apart
            threshold = total_after
            spared = [total_before] if total_before / scale <= threshold else []
            what = (f"the gradients' total norm was brought to {threshold:.4g} on two steps whose norms differed "
                    f"(a clip threshold), from {total_before:.4g}, still multiplied by the loss scale {scale:g}; "
                    f"unscaled ({total_before / scale:.4g}) it is below the threshold and would not have been clipped")
        if not spared:
            return
        inst.add(Finding(
            code="clip-before-unscale",
            message=f"the script clips gradients still multiplied by the loss scale (no `scaler.unscale_(optimizer)` "
                    f"before its clip): {what}",
            where=shrunk[0][2],
            fix="call `scaler.unscale_(optimizer)` right after `scaler.scale(loss).backward()` and before the "
                "clipping call at this line, then `scaler.step(optimizer)` and `scaler.update()`",
            step=inst.step), key=("clip-before-unscale",))


def _norms_and_peaks(grads: list[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Each gradient's norm and largest |element|, read in one transfer."""
    dev = grads[0].device
    norms = torch.stack([g.detach().float().norm().to(dev) for g in grads])
    peaks = torch.stack([g.detach().float().abs().max().to(dev) for g in grads])
    both = torch.stack([norms, peaks]).cpu().tolist()
    return both[0], both[1]
