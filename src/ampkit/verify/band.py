"""The verdict of ``ampkit compare`` as pure functions: the FP32 seed band and the four failure rules.

Nothing here trains, times or prints: every function takes numbers (loss curves, final metrics, skip
counts, the trainer's warnings) and returns numbers and sentences, so the rules can be tested on
constructed inputs and reused by ``compare --explain`` to judge its reruns against the same band.

* **Loss band.** At every logged step the FP32 seeds give ``lo`` (min), ``hi`` (max) and a spread
  estimate ``sigma = (hi - lo) / d2(n)`` (Shewhart's range estimator: ``d2(2) = 1.128``,
  ``d2(3) = 1.693``; the sample standard deviation above 10 seeds). The band is widened by
  ``margin = max(BAND_SIGMAS * sigma, BAND_REL * |mean|)``: two more sigmas above the highest of
  a few seeds is a level a fresh FP32 seed exceeds well under 1 % of the time, and the relative
  floor covers the late steps where seeds agree so closely that ``sigma`` is tiny.
  The AMP curve of every seed **diverges at step k** when its loss is above ``hi + margin`` from
  step k to the end of the run (at least ``MIN_OUT_POINTS`` logged points: a last-step blip does not
  count), or **non-finite at step k** when every loss of a logging window was NaN/Inf. A curve
  *below* the band is reported as a warning, not a failure: it is better, not harmed.
* **Final metric.** The task's metric (e.g. test accuracy; the final training loss when the task has
  none) is judged on the mean over AMP seeds against the FP32 seeds' range widened by
  ``METRIC_ABS`` (one percentage point) for rates in [0, 1], else ``METRIC_REL`` (2 %) of the FP32
  mean. Only the harmful direction fails.
* **Skipped steps.** More than ``MAX_SKIP_SHARE`` (5 %) of any AMP run's optimizer steps skipped
  (non-finite gradients) fails.
* **Scale collapse.** The trainer's :class:`~ampkit.engine.monitor.ScaleMonitor` warning ``scale-collapse``
  in any FP16 run fails, with its fix.
* **FP32 reference.** A non-finite FP32 loss fails the comparison: the task itself must be fixed first.

>>> from ampkit.verify.band import RunOutcome, judge
>>> fp32 = {s: RunOutcome(curve=[[10, 1.0], [20, 0.5]], final=0.9, steps=20) for s in (0, 1)}
>>> amp = {s: RunOutcome(curve=[[10, 1.0], [20, 0.5]], final=0.9, steps=20) for s in (0, 1)}
>>> judge(label="BF16", fp32=fp32, amp=amp, metric="accuracy", higher_is_better=True).verdict
'pass'
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = ["band", "judge", "judge_curve", "seed_reasons", "judge_metric", "merge_seeds", "first_exit", "RunOutcome", "Verdict",
           "BAND_SIGMAS", "BAND_REL", "METRIC_ABS", "METRIC_REL", "MAX_SKIP_SHARE", "MIN_OUT_POINTS", "MARGINS"]

BAND_SIGMAS = 2.0
BAND_REL = 0.10
METRIC_ABS = 0.01
METRIC_REL = 0.02
MAX_SKIP_SHARE = 0.05
MIN_OUT_POINTS = 3
MARGINS = {"band_sigmas": BAND_SIGMAS, "band_rel": BAND_REL, "metric_abs": METRIC_ABS, "metric_rel": METRIC_REL,
           "max_skip_share": MAX_SKIP_SHARE, "min_out_points": MIN_OUT_POINTS}

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


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """``verdict`` is "pass" or "fail"; ``reasons`` say why it failed, one sentence each."""

    verdict: str
    reasons: tuple[str, ...]
    warnings: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    band: dict[str, Any]
    final_metric: dict[str, Any]
    skipped: dict[str, Any]
    exits: dict[int, int | None] = field(default_factory=dict)  # seed -> first logged step above the band

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


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


def _points(curve: Curve, b: dict[str, list]) -> list[tuple[int, float, float, float]]:
    """``(step, loss, upper, lower)`` of the curve's points where the band is defined."""
    upper = dict(zip(b["steps"], b["upper"]))
    lower = dict(zip(b["steps"], b["lower"]))
    pts = [(int(s), v, upper.get(int(s)), lower.get(int(s))) for s, v in curve]
    return [p for p in pts if p[2] is not None]


def _run_from_end(points: list, pred) -> int:
    n = 0
    for p in reversed(points):
        if not pred(p):
            break
        n += 1
    return n


def judge_curve(seed: int, curve: Curve, b: dict[str, list], label: str) -> tuple[str | None, str | None]:
    """(failure reason or None, below-band warning or None) for one AMP curve."""
    for step, loss in curve:
        if loss is None or not math.isfinite(loss):
            return f"{label} loss became non-finite at step {int(step)} (seed {seed})", None
    points = _points(curve, b)
    if not points:
        return None, None
    need = min(MIN_OUT_POINTS, len(points))
    above = _run_from_end(points, lambda p: p[1] > p[2])
    if above >= need:
        step, v, up, _ = points[len(points) - above]
        last = points[-1]
        return (f"{label} diverged at step {step} (seed {seed}): its loss left the FP32 band for good "
                f"({v:.4g} > {up:.4g}; at the end {last[1]:.4g} > {last[2]:.4g})"), None
    below = _run_from_end(points, lambda p: p[1] < p[3])
    if below >= need:
        step = points[len(points) - below][0]
        return None, (f"{label} loss is below the FP32 band from step {step} to the end (seed {seed}): better "
                      f"than every FP32 seed, which is unusual; run more --seeds to be sure")
    return None, None


def first_exit(curve: Curve, b: dict[str, list]) -> int | None:
    """The first logged step where the curve is non-finite or above the band (even if it comes back), or None."""
    upper = dict(zip(b["steps"], b["upper"]))
    for step, loss in curve:
        if loss is None or not math.isfinite(loss):
            return int(step)
        up = upper.get(int(step))
        if up is not None and loss > up:
            return int(step)
    return None


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


# ---------------------------------------------------------------------------------------- the final metric
def _metric_margin(name: str, values: list[float]) -> tuple[float, str]:
    if values and all(0.0 <= v <= 1.0 for v in values) and "loss" not in name:
        return METRIC_ABS, f"{METRIC_ABS * 100:g} percentage point"
    mean = statistics.fmean(values) if values else 0.0
    return METRIC_REL * abs(mean), f"{METRIC_REL * 100:g}% of the FP32 mean"


def judge_metric(name: str, higher_is_better: bool, fp32: list[float], amp: list[float], label: str
                 ) -> tuple[str | None, dict[str, Any]]:
    """(failure reason or None, the numbers behind it) for the mean final metric of the AMP seeds."""
    info: dict[str, Any] = {"name": name, "higher_is_better": higher_is_better, "fp32": fp32, "amp": amp}
    if not fp32 or not amp:
        info["allowed"] = None
        return None, info
    if any(not math.isfinite(v) for v in amp):
        return f"final {name} of {label} is not finite ({amp})", info
    margin, margin_text = _metric_margin(name, fp32)
    lo, hi = min(fp32), max(fp32)
    f_mean, a_mean = statistics.fmean(fp32), statistics.fmean(amp)
    info.update(margin=margin, margin_text=margin_text, fp32_mean=f_mean, amp_mean=a_mean,
                allowed=[lo - margin, hi + margin])
    span = f"FP32 seeds {lo:.4g}..{hi:.4g}"
    if higher_is_better and a_mean < lo - margin:
        return (f"final {name} lower by {f_mean - a_mean:.3g} ({label} {a_mean:.4g} vs FP32 {f_mean:.4g}; "
                f"{span}, allowed down to {lo - margin:.4g})"), info
    if not higher_is_better and a_mean > hi + margin:
        return (f"final {name} higher by {a_mean - f_mean:.3g} ({label} {a_mean:.4g} vs FP32 {f_mean:.4g}; "
                f"{span}, allowed up to {hi + margin:.4g})"), info
    return None, info


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


def _trainer_warnings(amp: dict[int, RunOutcome], bf16_advice: str | None
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


def seed_reasons(seed: int, run: RunOutcome, b: dict[str, list], label: str) -> list[str]:
    """The rules one run can fail on its own (curve, skipped share, scale collapse): an early "fail" for reruns."""
    reason, _ = judge_curve(seed, run.curve, b, label)
    out = [reason] if reason else []
    out += _skips({seed: run}, label)
    out += _trainer_warnings({seed: run}, None)[1]
    return out


def judge(*, label: str, fp32: dict[int, RunOutcome], amp: dict[int, RunOutcome], metric: str,
          higher_is_better: bool, bf16_advice: str | None = None) -> Verdict:
    """Apply every rule of the module docstring; ``bf16_advice`` is added to a scale-collapse fix when given."""
    reasons = _fp32_reference(fp32)
    notes = []
    b = band({s: r.curve for s, r in fp32.items()})
    if len(fp32) == 1:
        notes.append("one seed: no seed-to-seed spread measured, the band is the relative margin alone; "
                     "use --seeds 3")
    curve_reasons: list[str] = []
    warnings: list[dict[str, Any]] = []
    for s, r in amp.items():
        reason, below = judge_curve(s, r.curve, b, label)
        if reason:
            curve_reasons.append(reason)
        if below:
            warnings.append({"code": "below-band", "message": below, "fix": "", "seeds": [s]})
    reasons += merge_seeds(curve_reasons)
    reasons += _skips(amp, label)
    trainer_warnings, collapse = _trainer_warnings(amp, bf16_advice)
    warnings += trainer_warnings
    reasons += collapse
    metric_reason, metric_info = judge_metric(metric, higher_is_better, [r.final for r in fp32.values()],
                                              [r.final for r in amp.values()], label)
    if metric_reason:
        reasons.append(metric_reason)
    steps = max((r.steps for r in amp.values()), default=0)
    skipped = {"amp": {s: r.skipped for s, r in amp.items()}, "fp32": {s: r.skipped for s, r in fp32.items()},
               "steps": steps, "max_share": MAX_SKIP_SHARE}
    return Verdict(verdict="fail" if reasons else "pass", reasons=tuple(reasons), warnings=tuple(warnings),
                   notes=tuple(notes), band=b, final_metric=metric_info, skipped=skipped,
                   exits={s: first_exit(r.curve, b) for s, r in amp.items()})
