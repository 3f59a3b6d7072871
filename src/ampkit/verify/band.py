"""The FP32 seed band (for the report's plot) and the hard failure rules of ``ampkit compare``.

The verdict itself is the paired equivalence test of :mod:`ampkit.verify.judge`; this module keeps
what does not need statistics, as pure functions on numbers:

* **The band** (drawn in the report, never the verdict). At every logged step the FP32 seeds give
  ``lo`` (min), ``hi`` (max) and a spread ``sigma = (hi - lo) / d2(n)`` (Shewhart's range estimator;
  the sample standard deviation above 10 seeds), widened by ``max(BAND_SIGMAS * sigma, BAND_REL * |mean|)``.
* **Hard failures**, whatever the statistics say: a non-finite FP32 loss (the task must be fixed
  first); an AMP loss window that is all NaN/Inf ("loss became non-finite at step k"), or a
  non-finite AMP final metric; more than ``MAX_SKIP_SHARE`` (5 %) of an AMP run's optimizer steps
  skipped; the trainer's ``scale-collapse`` warning in an FP16 run, with its fix.

``judge`` and ``Verdict`` moved to :mod:`ampkit.verify.judge` (which imports this module, so this one
cannot import them back).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["band", "seed_reasons", "hard_reasons", "trainer_warnings", "merge_seeds", "RunOutcome",
           "BAND_SIGMAS", "BAND_REL", "MAX_SKIP_SHARE", "MARGINS"]

BAND_SIGMAS = 2.0
BAND_REL = 0.10
MAX_SKIP_SHARE = 0.05
MARGINS = {"band_sigmas": BAND_SIGMAS, "band_rel": BAND_REL, "max_skip_share": MAX_SKIP_SHARE}

# Shewhart's d2(n): expected range of n standard normal samples.
_D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}
_BAND_KEYS = ("lo", "hi", "mean", "sigma", "margin", "upper", "lower")

Curve = list[list[float | None]]  # [[step, loss or None], ...]


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What the verdict needs from one training run (one seed, one precision)."""

    curve: Curve
    final: float  # the judged final metric (NaN when the run has none)
    steps: int  # optimizer steps taken
    skipped: int = 0
    warnings: tuple[dict[str, Any], ...] = ()  # the trainer's warnings (ScaleMonitor's scale-collapse)


# ---------------------------------------------------------------------------------------- the band
def _sigma(vals: list[float], lo: float, hi: float) -> float:
    n = len(vals)
    if n == 1:
        return 0.0
    if n in _D2:
        return (hi - lo) / _D2[n]
    return statistics.stdev(vals)


def band(curves: dict[int, Curve]) -> dict[str, list[float | None]]:
    """Per logged step of the FP32 curves: ``steps, lo, hi, mean, sigma, margin, upper, lower``.

    ``upper``/``lower`` are the widened band the AMP curve is judged against (module docstring).
    A step where any FP32 seed was non-finite gets None everywhere.
    """
    seeds = list(curves)
    steps = [int(p[0]) for p in curves[seeds[0]]]
    out: dict[str, list[float | None]] = {k: [] for k in _BAND_KEYS}
    out["steps"] = steps  # type: ignore[assignment]
    by_seed = {s: {int(p[0]): p[1] for p in curves[s]} for s in seeds}
    for step in steps:
        vals = [by_seed[s].get(step) for s in seeds]
        if any(v is None or not math.isfinite(v) for v in vals):
            for k in _BAND_KEYS:
                out[k].append(None)
            continue
        lo, hi, mean = min(vals), max(vals), statistics.fmean(vals)
        sigma = _sigma(vals, lo, hi)
        margin = max(BAND_SIGMAS * sigma, BAND_REL * abs(mean))
        for k, v in zip(_BAND_KEYS, (lo, hi, mean, sigma, margin, hi + margin, lo - margin)):
            out[k].append(v)
    return out


def merge_seeds(reasons: list[str]) -> list[str]:
    """``"... at step 1 (seed 0)"`` and ``"... at step 1 (seed 1)"`` become ``"... at step 1 (seeds 0, 1)"``."""
    groups: dict[str, list[str]] = {}
    order: list[str] = []
    for text in reasons:
        head, sep, tail = text.partition(" (seed ")
        seed, _, rest = tail.partition(")")
        key = head + "\0" + rest if sep else text
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(seed if sep else "")
    out = []
    for key in order:
        seeds = groups[key]
        if "\0" not in key:
            out.append(key)
            continue
        head, rest = key.split("\0", 1)
        out.append(f"{head} (seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}){rest}")
    return out


# ---------------------------------------------------------------------------------------- the rules
def _fp32_reference(fp32: dict[int, RunOutcome]) -> list[str]:
    out = []
    for s, r in fp32.items():
        bad = next((p[0] for p in r.curve if p[1] is None or not math.isfinite(p[1])), None)
        if bad is not None:
            out.append(f"the FP32 reference itself became non-finite at step {int(bad)} (seed {s}): fix the task "
                       "(learning rate, data) before judging precisions")
    return out


def _skips(amp: dict[int, RunOutcome], label: str) -> list[str]:
    bad = {s: r for s, r in amp.items() if r.skipped / max(r.steps, 1) > MAX_SKIP_SHARE}
    if not bad:
        return []
    worst = max(r.skipped / max(r.steps, 1) for r in bad.values())
    detail = ", ".join(f"seed {s}: {r.skipped} of {r.steps}" for s, r in bad.items())
    return [f"{worst:.0%} of {label} steps skipped ({detail}; more than {MAX_SKIP_SHARE:.0%} fails): "
            "their gradients were not finite"]


def trainer_warnings(amp: dict[int, RunOutcome], bf16_advice: str | None
                      ) -> tuple[list[dict[str, Any]], list[str]]:
    """The trainer's warnings merged over seeds (one entry with their seeds), and the scale-collapse reason."""
    warnings: list[dict[str, Any]] = []
    collapsed: list[tuple[int, dict[str, Any]]] = []
    for s, r in amp.items():
        for w in r.warnings:
            fix = w.get("fix", "")
            if w.get("code") == "scale-collapse" and bf16_advice and bf16_advice not in fix:
                fix = f"{bf16_advice}; or {fix}"
            same = next((x for x in warnings if x.get("code") == w.get("code") and x.get("message") == w.get("message")),
                        None)
            if same is not None:
                same["seeds"].append(s)
            else:
                warnings.append({**w, "fix": fix, "seeds": [s]})
            if w.get("code") == "scale-collapse":
                collapsed.append((s, {**w, "fix": fix}))
    if not collapsed:
        return warnings, []
    w0 = collapsed[0][1]
    seeds_txt = ", ".join(str(s) for s, _ in collapsed)
    return warnings, [f"scale collapsed (seed{'s' if len(collapsed) > 1 else ''} {seeds_txt}): "
                      f"{w0['message']}. fix: {w0['fix']}"]


def _non_finite(amp: dict[int, RunOutcome], label: str) -> list[str]:
    out = []
    for s, r in amp.items():
        bad = next((p[0] for p in r.curve if p[1] is None or not math.isfinite(p[1])), None)
        if bad is not None:
            out.append(f"{label} loss became non-finite at step {int(bad)} (seed {s})")
    return merge_seeds(out)


def hard_reasons(fp32: dict[int, RunOutcome], amp: dict[int, RunOutcome], label: str, metric: str) -> list[str]:
    """The failures no statistics can excuse, except scale collapse (:func:`trainer_warnings` gives that one)."""
    out = _fp32_reference(fp32) + _non_finite(amp, label)
    bad = [s for s, r in amp.items() if not math.isfinite(r.final) and s in fp32 and math.isfinite(fp32[s].final)]
    if bad:
        out.append(f"final {metric} of {label} is not finite (seed{'s' if len(bad) > 1 else ''} "
                   f"{', '.join(map(str, bad))})")
    return out + _skips(amp, label)


def seed_reasons(seed: int, run: RunOutcome, label: str) -> list[str]:
    """The hard rules one run fails on its own (non-finite loss, skipped share, scale collapse): an early "fail"
    for reruns. The paired test needs every seed, so it is not among them."""
    return _non_finite({seed: run}, label) + _skips({seed: run}, label) + trainer_warnings({seed: run}, None)[1]
