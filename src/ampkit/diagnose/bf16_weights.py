"""``bf16-weights-without-master``: an optimizer updates BF16 (pure low-precision) parameters with no FP32 copy.

The check measures what it reports. For the first :data:`MEASURED_STEPS` optimizer steps that update BF16
parameters, it keeps the parameters before the step and counts, after it, the elements whose gradient was
non-zero and whose value did not change: updates smaller than half a BF16 rounding step (about 1/256 of the
weight) that the optimizer computed and the storage rounded away. Where the conversion happened
(``module.to(torch.bfloat16)``, ``module.bfloat16()``, ``module.to(dtype=...)`` at a line of the script) is noted
by wrapping those two methods; without such a line the finding points at the optimizer step.

Optimizers over FP32 parameters (autocast with FP32 weights, or a hand-kept FP32 master copy) are not reported,
and neither are FP16 parameters (``fp16-weights-without-master`` covers them).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.tracking import frame_where

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["Bf16WeightChecks", "MEASURED_STEPS", "CODE"]

CODE = "bf16-weights-without-master"
MEASURED_STEPS = 3


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def _to_bf16(args: tuple, kwargs: dict) -> bool:
    values = list(args) + list(kwargs.values())
    return any(v is torch.bfloat16 for v in values)


class Bf16WeightChecks:
    """Wraps ``Module.to`` / ``Module.bfloat16`` and watches optimizer steps (pre- and post-hooks)."""

    def __init__(self, inst: "Instrumentation") -> None:
        self.inst = inst
        self._converted: list[tuple[weakref.ref, str]] = []
        self._before: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._measured = 0
        self._changed_nothing = 0
        self._updated = 0
        self._where: str | None = None
        self._counts: tuple[int, int] | None = None

    # ------------------------------------------------------------------ conversions
    def _note(self, module: torch.nn.Module) -> None:
        f = self.inst.user.caller_is_user(2)
        if f is not None:
            self._converted.append((weakref.ref(module), frame_where(f)))

    def wrap_module_to(self, orig):
        checks = self

        def to(module, *args, **kwargs):
            if not is_compiling() and not checks.inst._paused and _to_bf16(args, kwargs):
                checks._note(module)
            return orig(module, *args, **kwargs)

        return to

    def wrap_module_bfloat16(self, orig):
        checks = self

        def bfloat16(module):
            if not is_compiling() and not checks.inst._paused:
                checks._note(module)
            return orig(module)

        return bfloat16

    # ------------------------------------------------------------------ optimizer steps
    def before_step(self, optimizer: Any) -> None:
        """Keep the BF16 parameters that have a gradient, for the first steps."""
        if self._measured >= MEASURED_STEPS:
            return
        params = _params(optimizer)
        low = [p for p in params if p.dtype == torch.bfloat16 and p.grad is not None]
        if not low:
            return
        self._before[id(optimizer)] = [(p, p.detach().clone()) for p in low]
        if self._where is None:
            ids = {id(p) for p in low}
            self._where = next((w for ref, w in self._converted
                                if ref() is not None and any(id(p) in ids for p in ref().parameters())),
                               self.inst.user.where(3))
            self._counts = (sum(1 for p in params if p.dtype == torch.bfloat16), len(params))

    def after_step(self, optimizer: Any) -> None:
        """Count the updates with a non-zero gradient that left the value unchanged."""
        kept = self._before.pop(id(optimizer), None)
        if not kept:
            return
        moved_any = False
        for p, old in kept:
            if p.grad is None:
                continue
            active = p.grad.detach() != 0
            same = p.detach() == old
            self._updated += int(active.sum())
            self._changed_nothing += int((active & same).sum())
            moved_any = moved_any or bool((p.detach() != old).any())
        if moved_any or self._updated:
            self._measured += 1  # a step the optimizer skipped (GradScaler) is not a measured step

    def finish(self) -> None:
        """Turn the measurement into the finding."""
        if not self._updated or self._where is None or self.inst.has(CODE):
            return
        share = self._changed_nothing / self._updated
        low, total = self._counts or (0, 0)
        self.inst.add(Finding(
            code=CODE,
            message=f"{low} of {total} parameters the optimizer updates are BF16 with no FP32 master copy: in the "
                    f"first {self._measured} step(s), {share:.1%} of the updates with a non-zero gradient changed "
                    f"nothing ({self._changed_nothing:,} of {self._updated:,} weights stayed where they were): "
                    "updates smaller than half a BF16 rounding step (about 1/256 of the weight) are rounded away",
            where=self._where, fix=fix_for(CODE), step=0), key=(CODE,))
