"""The dtype each value would have in the FP16 run, followed through the FP32 run of ``--fp16-range``.

The range run computes everything in FP32, but autocast does not run everything in FP16: it casts
matmuls and convolutions down, keeps precision-sensitive ops (softmax, norms, losses, exp, pow...) in
FP32, and leaves the rest to type promotion (``fp16 * fp32`` is FP32). An FP32 value above 65504 is an
FP16 overflow only where the AMP run holds it in FP16. :class:`AmpDtypes` follows autocast's own rules
rather than a list of ours: the first time an op is seen with a given combination of input dtypes, it
runs once more under ``torch.autocast(device, dtype=torch.float16)`` on inputs cast to the dtypes they
would have, and the dtype it returns is the AMP dtype of its output (cached per op and input dtypes).
Ops that change their inputs in place, or draw random numbers, are not run again: they keep their
inputs' dtype. Regions where the script turns autocast off (``enabled=False``) keep their dtypes.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

import torch

from ampkit.diagnose.tracking import tensor_leaves

__all__ = ["AmpDtypes"]

_LOW = (torch.float16, torch.bfloat16)


class AmpDtypes:
    """Follows, per tensor of the FP32 run, the dtype autocast to FP16 would give it."""

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        self.dtype = dtype
        self._of: dict[int, tuple[weakref.ref, torch.dtype]] = {}
        self._rules: dict[tuple, torch.dtype | None] = {}
        self.enabled: list[bool] = []  # the script's autocast regions (innermost last); none: assume on
        # a context in which ampkit's own wrappers leave torch.autocast alone (the diagnose run's pause)
        self.quiet: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def of(self, t: torch.Tensor) -> torch.dtype:
        """The dtype ``t`` would have in the AMP run (its own dtype when the run has not seen it made)."""
        hit = self._of.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return t.dtype

    def mark(self, t: torch.Tensor, dtype: torch.dtype) -> None:
        """``t`` has ``dtype`` in the AMP run (a cast the FP32 run could not see: ``y.float()`` of an FP32 ``y``)."""
        self._of[id(t)] = (weakref.ref(t), dtype)

    def is_low(self, t: torch.Tensor) -> bool:
        return self.of(t) in _LOW

    def note(self, func, args: tuple, kwargs: dict | None, out: Any) -> None:
        """Record the AMP dtype of ``func``'s floating outputs, given the AMP dtypes of its inputs."""
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not outs:
            return
        ins = tensor_leaves((args, kwargs or {}))  # the floating ones
        in_dtypes = tuple(self.of(t) for t in ins)
        if func.is_view or func._schema.is_mutable or torch.Tag.nondeterministic_seeded in func.tags:
            dtype = in_dtypes[0] if in_dtypes else None  # a view, an in-place op or dropout keeps its input's dtype
        else:
            on = self.enabled[-1] if self.enabled else True
            asked = tuple(a for a in list(args) + list((kwargs or {}).values()) if isinstance(a, torch.dtype))
            key = (func, in_dtypes, asked, on)
            if key not in self._rules:
                self._rules[key] = self._ask(func, args, kwargs, on)
            dtype = self._rules[key]
        if dtype is None:
            return
        if len(self._of) > 65536:
            self._of = {k: v for k, v in self._of.items() if v[0]() is not None}
        for t in outs:
            self._of[id(t)] = (weakref.ref(t), dtype)

    def _ask(self, func, args: tuple, kwargs: dict | None, on: bool) -> torch.dtype | None:
        """Run ``func`` once under autocast on inputs cast to their AMP dtypes; the dtype of its first floating
        output (None when it cannot run so)."""
        cast = _map(lambda t: t.to(self.of(t)) if t.is_floating_point() and self.of(t) != t.dtype else t, (args, kwargs or {}))
        dev = next((t.device.type for t in tensor_leaves((args, kwargs or {}))), "cpu")
        try:
            with self.quiet(), torch.no_grad(), torch.autocast(dev, dtype=self.dtype, enabled=on):
                out = func(*cast[0], **cast[1])
        except Exception:  # noqa: BLE001 - an op autocast cannot run here: no rule, the output keeps its dtype
            return None
        first = next((t for t in (out if isinstance(out, (tuple, list)) else (out,))
                      if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        return first.dtype if first is not None else None


def _map(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map(fn, o) for o in obj)
    if isinstance(obj, list):
        return [_map(fn, o) for o in obj]
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return obj
