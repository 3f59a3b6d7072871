"""Whether FP8 pays for this model on this card, decided once, where the model is known.

:func:`~ampkit.device.policy.resolve_precision` decides the dtype from the card alone; FP8's worth depends on
the model's layer shapes, the tokens a step and whether the model is compiled, so the run's setup
(``ampkit train``, ``ampkit bench``) calls :func:`choose_fp8` once, before the model is wrapped or
compiled, and the :class:`~ampkit.device.policy.Precision` it returns is the run's from then on:

* ``--precision fp8`` with ``layers="paying"`` (the default): the layers converted are those the cost model
  (:mod:`ampkit.engine.fp8_cost`, probed on this card at first use) predicts faster in FP8; when none is,
  the request is **refused** with one line and the fix (it was asked for by name: falling back would hide
  that it cannot pay). Without a cost model (no probe possible) the layers are chosen by shape and the note
  says so.
* ``layers="eligible"``: every layer the filter allows (alignment, head, ``keep``), speed not checked: for
  FP8's numerics or memory.
* ``auto``: BF16 stays unless the card has FP8, torchao is installed and the plan predicts at least
  :data:`AUTO_MIN_SPEEDUP` on the linear layers; either way one note says what was decided and why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from torch import nn

from ampkit import compat
from ampkit.choices import FP8_LAYERS
from ampkit.device.hardware import card_facts
from ampkit.device.policy import Precision, resolve_precision
from ampkit.engine.fp8 import FP8Filter, FP8Report, plan
from ampkit.engine.fp8_cost import CostModel
from ampkit.errors import PrecisionUnsupported, UsageError

__all__ = ["FP8Choice", "choose_fp8", "refusal", "AUTO_MIN_SPEEDUP"]

AUTO_MIN_SPEEDUP = 1.10  # auto picks FP8 only for a predicted gain worth FP8's coarser numerics
CostLookup = Callable[[Precision, str, str], "tuple[CostModel | None, str]"]


@dataclass(frozen=True)
class FP8Choice:
    """The run's precision after the FP8 decision, the plan to convert (None: no FP8) and one line about it."""

    precision: Precision
    report: FP8Report | None
    note: str | None


def _lookup(precision: Precision, recipe: str, mode: str) -> tuple[CostModel | None, str]:
    from ampkit.engine.fp8_probe import cost_model

    return cost_model(precision.device, recipe, mode)


def refusal(model: nn.Module, report: FP8Report, mode: str) -> str:
    """The one line ``--precision fp8`` is refused with when no layer pays."""
    best = max(report.predicted, key=lambda p: p[1] / p[2], default=None)
    where = f"best: {best[0]} {best[1] / best[2]:.2f}x; " if best else ""
    fix = ("compile the model (ampkit bench --compile), use --precision bf16, or --fp8-layers eligible to train "
           "in FP8 anyway" if mode == "eager" else
           "use --precision bf16 (FP8 pays on larger layers or more tokens a step), or --fp8-layers eligible to "
           "train in FP8 anyway")
    return (f"FP8 would make this run slower: no linear layer of {type(model).__name__} is predicted faster in FP8 "
            f"{mode} at {report.tokens} tokens a step ({where}cost model: {report.cost_source}): {fix}")


def choose_fp8(model: nn.Module, precision: Precision, *, auto: bool, recipe: str, tokens: int, mode: str,
               layers: str = "paying", filter: FP8Filter | None = None,
               lookup: CostLookup | None = None) -> FP8Choice:
    """Decide FP8 for ``model`` (not yet converted): ``precision`` is the resolved request (``fp8``, or the
    BF16 that ``auto`` resolved to when ``auto``); ``tokens``: rows each linear layer sees per step; ``mode``:
    ``"eager"`` or ``"compiled"``. Raises :class:`~ampkit.errors.PrecisionUnsupported` for an explicit FP8
    that no layer pays for. ``lookup`` replaces the cached-or-probed cost model (tests, recorded figures)."""
    if layers not in FP8_LAYERS:
        raise UsageError(f"--fp8-layers must be one of {', '.join(FP8_LAYERS)}, got {layers!r}")
    lookup = lookup or _lookup
    if auto:
        return _auto(model, precision, recipe=recipe, tokens=tokens, mode=mode, filter=filter, lookup=lookup)
    if precision.name != "fp8":
        return FP8Choice(precision, None, None)
    if layers == "eligible":
        report = plan(model, filter, recipe=recipe)
        return FP8Choice(precision, report, report.summary() + " (--fp8-layers eligible: speed not checked)")
    cost, how = lookup(precision, recipe, mode)
    if cost is None:
        report = plan(model, filter, recipe=recipe)
        return FP8Choice(precision, report, f"{report.summary()}; layers chosen by shape: {how}")
    report = plan(model, filter, recipe=recipe, tokens=tokens, cost=cost)
    if not report.converted:
        raise PrecisionUnsupported(refusal(model, report, mode))
    return FP8Choice(precision, report, f"{report.summary()}; {how}")


def _auto(model: nn.Module, bf16: Precision, *, recipe: str, tokens: int, mode: str, filter: FP8Filter | None,
          lookup: CostLookup) -> FP8Choice:
    if bf16.name != "bf16":
        return FP8Choice(bf16, None, None)  # auto found no BF16 here: FP8 (BF16 autocast) cannot be either
    if card_facts(bf16.device).fp8 is False or compat.torchao_missing():
        return FP8Choice(bf16, None, None)  # the card table says no FP8, or no torchao: no probe paid for
    try:
        fp8 = resolve_precision("fp8", bf16.device, tf32=bf16.tf32)
    except PrecisionUnsupported:
        return FP8Choice(bf16, None, None)  # no FP8 on this card (or no torchao): nothing to weigh
    cost, how = lookup(fp8, recipe, mode)
    if cost is None:
        return FP8Choice(bf16, None, f"auto: BF16; FP8 not weighed ({how})")
    report = plan(model, filter, recipe=recipe, tokens=tokens, cost=cost)
    speedup = report.speedup or 1.0
    if not report.converted or speedup < AUTO_MIN_SPEEDUP:
        return FP8Choice(bf16, None, f"auto: BF16; FP8 {recipe} {mode} is predicted {speedup:.2f}x on the linear "
                                     f"layers (auto takes FP8 from {AUTO_MIN_SPEEDUP:.2f}x; "
                                     f"cost model: {cost.source()})")
    reason = (f"auto: {report.summary()}: BF16 autocast with torchao FP8 linear layers where they pay "
              f"(from {AUTO_MIN_SPEEDUP:.2f}x; --precision bf16 to keep BF16)")
    return FP8Choice(dataclasses.replace(fp8, reason=reason), report, report.summary())
