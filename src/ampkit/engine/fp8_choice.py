"""Whether FP8 pays for this model on this card, decided once, where the model is known.

:func:`~ampkit.device.policy.resolve_precision` decides the dtype from the card alone; FP8's worth depends on
the model's layer shapes, the tokens a step and whether the model is compiled, so the run's setup
(``ampkit train``, ``ampkit bench``) calls :func:`choose_fp8` once, before the model is wrapped or
compiled, and the :class:`~ampkit.device.policy.Precision` it returns is the run's from then on:

* ``--precision fp8`` with ``layers="paying"`` (the default) and a ``trial`` (the caller can time the model:
  ``train``, ``compare`` and ``bench`` on an accelerator): :func:`measured_decision` times BF16, FP8 on every
  eligible layer and a pruned candidate or two on the model itself (:mod:`ampkit.engine.fp8_trial`); the
  fastest converts if it beats BF16 beyond the rounds' spread and by 3 %, else the request is **refused** with
  the measured reason (it was asked for by name: falling back would hide that it cannot pay). The cost model
  only orders the candidates.
* the same without a trial (the CPU, several processes): the layers the cost model
  (:mod:`ampkit.engine.fp8_cost`, probed on this card at first use) predicts faster in FP8, refused when none
  is; without a cost model the layers are chosen by shape and the note says so.
* ``layers="eligible"``: every layer the filter allows (alignment, head, ``keep``), speed not checked: for
  FP8's numerics or memory.
* ``auto``: BF16 stays unless the card has FP8, torchao is installed and the trial measures (without a trial:
  the plan predicts) at least :data:`AUTO_MIN_SPEEDUP`; either way one note says what was decided and why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from torch import nn

from ampkit import compat
from ampkit.choices import FP8_LAYERS
from ampkit.device.hardware import card_facts
from ampkit.device.policy import Precision, resolve_precision
from ampkit.engine.fp8 import FP8Filter, FP8Report, plan
from ampkit.engine.fp8_cost import CostModel
from ampkit.engine.fp8_trial import MIN_GAIN, Measure, Progress, TrialResult, candidates, run_trial, to_report
from ampkit.errors import PrecisionUnsupported, UsageError

__all__ = ["FP8Choice", "TrialSetup", "choose_fp8", "measured_decision", "refusal", "AUTO_MIN_SPEEDUP"]

AUTO_MIN_SPEEDUP = 1.10  # auto picks FP8 only for a predicted gain worth FP8's coarser numerics
CostLookup = Callable[[Precision, str, str], "tuple[CostModel | None, str]"]


@dataclass(frozen=True)
class FP8Choice:
    """The run's precision after the FP8 decision, the plan to convert (None: no FP8) and one line about it."""

    precision: Precision
    report: FP8Report | None
    note: str | None
    trial: TrialResult | None = None  # the measured trial behind the decision, when one decided


@dataclass(frozen=True, kw_only=True)
class TrialSetup:
    """How to time the model for the measured decision (:mod:`ampkit.engine.fp8_trial`).

    ``measure(candidate) -> timer``: builds a candidate, each ``timer()`` returns ms per step
    (:class:`~ampkit.engine.fp8_trial_steps.StepTrial`, or the tests' own); ``batch``: one batch (its shapes go into
    the cache key); ``card`` / ``capability``: the device's, for the key; ``release``: frees what ``measure``
    built; ``cache_file``: None for :func:`~ampkit.engine.fp8_trial_cache.cache_path`; ``use_cache``: False to
    measure again; ``key_extra``: anything else the step depends on (e.g. the compile mode)."""

    measure: Measure
    batch: Any
    card: str
    capability: Any = None
    rounds: int = 3
    limit: int = 3
    progress: Progress | None = None
    release: Callable[[], None] | None = None
    use_cache: bool = True
    cache_file: Path | None = None
    key_extra: dict[str, Any] = field(default_factory=dict)


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
               lookup: CostLookup | None = None, trial: TrialSetup | None = None) -> FP8Choice:
    """Decide FP8 for ``model`` (not yet converted): ``precision`` is the resolved request (``fp8``, or the
    BF16 that ``auto`` resolved to when ``auto``); ``tokens``: rows each linear layer sees per step; ``mode``:
    ``"eager"`` or ``"compiled"``. Raises :class:`~ampkit.errors.PrecisionUnsupported` for an explicit FP8
    that no layer pays for. ``lookup`` replaces the cached-or-probed cost model (tests, recorded figures).

    With ``trial`` (where the model can be timed: ``ampkit train``, ``compare`` and ``bench`` on an accelerator),
    ``layers="paying"`` is decided by :func:`measured_decision`: the layer set that measured fastest, if it beat BF16
    beyond the spread and by >= 3 % (auto: by >= AUTO_MIN_SPEEDUP); the cost model only orders the candidates."""
    if layers not in FP8_LAYERS:
        raise UsageError(f"--fp8-layers must be one of {', '.join(FP8_LAYERS)}, got {layers!r}")
    lookup = lookup or _lookup
    if auto:
        return _auto(model, precision, recipe=recipe, tokens=tokens, mode=mode, filter=filter, lookup=lookup,
                     trial=trial)
    if precision.name != "fp8":
        return FP8Choice(precision, None, None)
    if layers == "eligible":
        report = plan(model, filter, recipe=recipe)
        return FP8Choice(precision, report, report.summary() + " (--fp8-layers eligible: speed not checked)")
    cost, how = lookup(precision, recipe, mode)
    if trial is not None:
        result = measured_decision(model, trial, recipe=recipe, mode=mode, filter=filter, cost=cost, tokens=tokens)
        if not result.fp8:
            exc = PrecisionUnsupported(f"FP8 would not make this run faster, measured on the model: {result.summary()}"
                                       ": use --precision bf16, or --fp8-layers eligible to train in FP8 anyway")
            exc.trial = result  # type: ignore[attr-defined]  # what was measured, for bench's record
            raise exc
        report = to_report(model, result, filter=filter)
        return FP8Choice(precision, report, f"{report.summary()}; {result.summary()}", trial=result)
    if cost is None:
        report = plan(model, filter, recipe=recipe)
        return FP8Choice(precision, report, f"{report.summary()}; layers chosen by shape: {how}")
    report = plan(model, filter, recipe=recipe, tokens=tokens, cost=cost)
    if not report.converted:
        raise PrecisionUnsupported(refusal(model, report, mode))
    return FP8Choice(precision, report, f"{report.summary()}; {how}")


def _auto(model: nn.Module, bf16: Precision, *, recipe: str, tokens: int, mode: str, filter: FP8Filter | None,
          lookup: CostLookup, trial: TrialSetup | None = None) -> FP8Choice:
    if bf16.name != "bf16":
        return FP8Choice(bf16, None, None)  # auto found no BF16 here: FP8 (BF16 autocast) cannot be either
    if card_facts(bf16.device).fp8 is False or compat.torchao_missing():
        return FP8Choice(bf16, None, None)  # the card table says no FP8, or no torchao: no probe paid for
    try:
        fp8 = resolve_precision("fp8", bf16.device, tf32=bf16.tf32)
    except PrecisionUnsupported:
        return FP8Choice(bf16, None, None)  # no FP8 on this card (or no torchao): nothing to weigh
    cost, how = lookup(fp8, recipe, mode)
    if trial is not None:
        result = measured_decision(model, trial, recipe=recipe, mode=mode, filter=filter, cost=cost, tokens=tokens,
                                   min_gain=AUTO_MIN_SPEEDUP - 1.0)
        if not result.fp8:
            return FP8Choice(bf16, None, f"auto: BF16; {result.summary()}", trial=result)
        report = to_report(model, result, filter=filter)
        reason = (f"auto: {report.summary()}, measured fastest ({result.reason}): BF16 autocast with torchao FP8 "
                  f"linear layers (--precision bf16 to keep BF16)")
        return FP8Choice(dataclasses.replace(fp8, reason=reason), report, f"{report.summary()}; {result.summary()}",
                         trial=result)
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


def measured_decision(model: nn.Module, setup: TrialSetup, *, recipe: str, mode: str, filter: FP8Filter | None = None,
                      cost: CostModel | None = None, tokens: int | None = None,
                      min_gain: float = MIN_GAIN) -> TrialResult:
    """The FP8 decision measured on ``model``: the cached result for this model, batch, card, mode and versions,
    else a trial of the candidates (cached afterwards, with its provenance)."""
    from ampkit.device.provenance import git_commit
    from ampkit.engine.fp8_trial_cache import load_trial, save_trial, trial_key

    report = setup.progress or (lambda ev: None)
    key = trial_key(model, setup.batch, card=setup.card, capability=setup.capability, mode=mode, recipe=recipe,
                    min_gain=round(min_gain, 4), extra=setup.key_extra)
    if setup.use_cache:
        cached = load_trial(key, setup.cache_file)
        if cached is not None:
            report({"event": "fp8_trial", "phase": "cached", "summary": cached.summary(), "result": cached.to_dict()})
            return cached
    cands = candidates(model, recipe=recipe, filter=filter, cost=cost, tokens=tokens, limit=setup.limit)
    try:
        result = run_trial(cands, setup.measure, mode=mode, recipe=recipe, rounds=setup.rounds, min_gain=min_gain,
                           progress=setup.progress)
    finally:
        if setup.release is not None:
            setup.release()
    result = dataclasses.replace(result, provenance={
        "source": "trial", "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ampkit_commit": git_commit(), "trial_s": round(result.trial_s, 1), "card": setup.card})
    if setup.use_cache:
        try:
            save_trial(key, result, setup.cache_file)
        except OSError:
            pass  # a read-only cache folder costs a trial next time, nothing else
    return result
