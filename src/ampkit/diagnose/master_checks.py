"""BF16 weights without an FP32 master copy, measured on one optimizer step.

An optimizer that updates BF16 parameters in place rounds every new weight to BF16's 8 significant
bits: an update smaller than half the weight's rounding step (about 1/256 of the weight) is lost. Some
pure-BF16 recipes are deliberate (an optimizer with stochastic rounding or Kahan summation), so this is
not reported from the dtype alone: :class:`MasterChecks` keeps the BF16 parameters' values before one
step the optimizer really takes, and after it counts the elements whose gradient was non-zero while
their value did not change. When most updates were lost, ``bf16-weights-without-master`` is reported at
the line that made the model BF16 (``model.to(torch.bfloat16)``, ``.bfloat16()``) when the run saw it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ampkit.diagnose.findings import Finding, fix_for

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["MasterChecks"]

_LOST_SHARE = 0.5          # at least this share of the non-zero-gradient elements kept their old value
_MAX_ELEMENTS = 1 << 22     # the values kept before the step: at most this many elements (16 MiB in FP32)
_TRIES = 3                  # steps measured at most (a step with zero gradients says nothing)


def _params(optimizer) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


class MasterChecks:
    """Measures lost BF16 updates on a few optimizer steps (see the module docstring)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._before: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # id(optimizer) -> (param, copy)
        self._tries = 0

    def before_step(self, optimizer) -> None:
        """Before a step of ``optimizer`` (inside the instrumentation's pause): keep its BF16 parameters' values."""
        inst = self.inst
        if self._tries >= _TRIES or inst.has("bf16-weights-without-master"):
            return
        kept, size = [], 0
        for p in _params(optimizer):
            if p.dtype != torch.bfloat16 or p.grad is None or size + p.numel() > _MAX_ELEMENTS:
                continue
            kept.append((p, p.detach().clone()))
            size += p.numel()
        if kept:
            self._before[id(optimizer)] = kept

    def after_step(self, optimizer) -> None:
        """After the optimizer really stepped: the share of updates BF16 lost."""
        kept = self._before.pop(id(optimizer), None)
        if not kept or self.inst.has("bf16-weights-without-master"):
            return
        self._tries += 1
        with torch.no_grad():
            dev = kept[0][0].device
            moved = [(p.grad != 0) for p, _ in kept if p.grad is not None]
            if len(moved) != len(kept):
                return
            stuck = torch.stack([((g != 0) & (p == old)).sum().to(dev) for (p, old), g in zip(kept, (p.grad for p, _ in kept))])
            live = torch.stack([m.sum().to(dev) for m in moved])
            lost, total = int(stuck.sum()), int(live.sum())
        if total == 0 or lost / total < _LOST_SHARE:
            return
        inst = self.inst
        params = [p for p, _ in kept]
        where = inst.loop_checks.half_line(params) or inst.user.where()
        inst.add(Finding(
            code="bf16-weights-without-master",
            message=f"the optimizer updates BF16 parameters with no FP32 master copy, and on this step {lost} of "
                    f"{total} weight elements ({lost / total:.0%}) with a non-zero gradient kept their old value: "
                    "each update was smaller than half the weight's BF16 rounding step (about 1/256 of the weight) "
                    "and was rounded away",
            where=where, fix=fix_for("bf16-weights-without-master"), step=inst.step),
            key=("bf16-weights-without-master",))
