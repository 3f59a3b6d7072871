"""BF16 weights without an FP32 master copy, measured on one optimizer step.

An optimizer that updates BF16 parameters in place rounds every new weight to BF16's 8 significant
bits: an update smaller than half the weight's rounding step (about 1/256 of the weight) is lost. Some
pure-BF16 recipes are deliberate (an optimizer with stochastic rounding or Kahan summation), so this is
not reported from the dtype alone: :class:`MasterChecks` keeps the BF16 parameters' values before one
step the optimizer really takes, and after it counts the elements whose gradient was non-zero while
their value did not change. ``bf16-weights-without-master`` is reported when most updates of the model, or
most updates of one parameter tensor, were lost: a model whose norm scales (all near 1.0, BF16 spacing 2**-7)
never move has a small share lost overall. Measured on one AdamW step (share lost over the model; worst
tensor): a litgpt-style block at lr 4e-4, 8 %; 100 % (its three RMSNorm scales), the same block at 1e-3, 5 %;
100 %, fine-tuning at 1e-5, 95 %; 100 %; while pure BF16 at a large learning rate, which is fine, loses at most
3 %; 28 % over its first three steps (the block at 1e-2 and 3e-2, a fine-tune at 3e-2). It is reported at
the line that made the model BF16 (``model.to(torch.bfloat16)``, ``.bfloat16()``) when the run saw it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ampkit.diagnose.findings import Finding, fix_for

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["MasterChecks"]

_LOST_SHARE = 0.5          # at least this share of the non-zero-gradient elements kept their old value,
                           # over the model or in one parameter tensor (module docstring: measured 0.28 vs 1.0)
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
            stuck = torch.stack([(m & (p == old)).sum().to(dev) for (p, old), m in zip(kept, moved)])
            live = torch.stack([m.sum().to(dev) for m in moved])
            stuck_n, live_n = stuck.cpu().tolist(), live.cpu().tolist()
        lost, total = sum(stuck_n), sum(live_n)
        inst = self.inst
        stuck_tensors = [(inst.tracker.param_name(p), s / n) for (p, _), s, n in zip(kept, stuck_n, live_n)
                         if n and s / n >= _LOST_SHARE]
        if total == 0 or (lost / total < _LOST_SHARE and not stuck_tensors):
            return
        params = [p for p, _ in kept]
        where = inst.loop_checks.half_line(params) or inst.user.where()
        names = ", ".join(f"{n} {v:.0%}" for n, v in sorted(stuck_tensors, key=lambda x: -x[1])[:4])
        inst.add(Finding(
            code="bf16-weights-without-master",
            message=f"the optimizer updates BF16 parameters with no FP32 master copy, and on this step {lost} of "
                    f"{total} weight elements ({lost / total:.0%}) with a non-zero gradient kept their old value"
                    + (f"; {len(stuck_tensors)} parameter tensors lost most of their updates ({names})" if stuck_tensors else "")
                    + ": each update was smaller than half the weight's BF16 rounding step (about 1/256 of the "
                    "weight) and was rounded away",
            where=where, fix=fix_for("bf16-weights-without-master"), step=inst.step),
            key=("bf16-weights-without-master",))
