"""THE verdict of ``ampkit compare`` (tasks, ``--explain`` reruns, FP8, scripts): a paired equivalence test.

Call shape (stable; ``compare``, ``compare --explain`` and ``compare SCRIPT`` use it)::

    judge(label="BF16", fp32={seed: RunOutcome}, amp={seed: RunOutcome}, metric="accuracy",
          higher_is_better=True, bf16_advice=None, tolerance=None, metric_count=None) -> Verdict

Every seed is trained in FP32 and in AMP from the same initial weights on the same batches, so for
each seed k the judge takes the **harm** of AMP relative to that seed's FP32 run, positive when AMP
is worse, for

1. **the final metric** (the task's, e.g. test accuracy; the final training loss when it has none):
   ``h_k = (FP32_k - AMP_k) / FP32_k`` when higher is better, ``(AMP_k - FP32_k) / FP32_k`` otherwise;
2. **the late loss**: the training loss averaged over the last quarter of the logged points;
3. **the whole curve** in ``WINDOWS`` (4) consecutive windows of the logged points (the last is 2.).

and tests it against the tolerance with one-sided Student-t bounds (:mod:`ampkit.verify.stats`).
The verdict is decided by 1. and 2., the *endpoints*:

* **pass** when *every* endpoint's upper bound (at ``ALPHA`` = 5 %) is below its tolerance. This is an
  intersection-union test: a pass claims all endpoints are within tolerance, and it is wrong only if
  one of them is not, which each test bounds by 5 % on its own: no multiplicity correction is needed.
* **fail** when *any* endpoint's lower bound is above its tolerance, each bound at ``ALPHA / m``
  (Bonferroni over the ``m`` endpoints): a fail claims at least one endpoint is beyond tolerance, so
  the family-wise chance of a false fail stays at most 5 %.
* **inconclusive** otherwise (exit code 3): the reasons say by how much, and about how many seeds
  would decide it.

The windows of 3. never decide a pass or fail on their own: a run that was worse early (an FP16 loss
scale warming up, a few skipped steps) and caught up by the end is not harmed. They are tested at
``ALPHA / WINDOWS`` (Bonferroni over the windows, so that a window named as "worse" is worse with the
family-wise 5 %), say where the curve leaves FP32 (``Verdict.exits``, what ``--explain`` follows), and
give a warning when an earlier window is worse and the end is not.

**Tolerances** (``tolerance``; relative to the FP32 value; one number for every quantity): by default
``TOLERANCE`` = 1 %. A final metric that **cannot tell the precisions apart** is reported as not informative
and only the loss decides (:func:`uninformative`): one that does not move (the same value in every run of both
precisions, e.g. an accuracy stuck at 0.5), a rate in [0, 1] such as accuracy whose **counting error**
``1 / (n_test * FP32 mean)`` (one test example more or less classified right; 0.28 points on digits' 359
test images) is coarser than the tolerance, and a tolerance that cannot fail (100 % or more of a rate where
higher is better). ``n_test`` is ``metric_count`` (compare reads ``Task.extra["n_test"]``), else inferred as
the smallest count of which every observed value is a multiple. A **loss** is taken relative to itself but never to less than
``LOSS_SCALE_FLOOR`` (a tenth) of the run's first logged loss: once a model has fit its training set,
the relative difference of two near-zero losses is the ratio of two tiny numbers that chaotic
training moves by several per cent between precisions (measured on digits), not a harm.
Why 1 % and not one counting error for accuracies: on digits the AMP-minus-FP32 accuracy of one seed
differs by 0 to 2 test images (sd 0.9 image, 5 seeds, BF16 on the CPU), so 3 seeds resolve about
+-1.7 images: a one-image tolerance would leave the default ``ampkit compare`` inconclusive.
**Floors** on the spread: a counting error over ``sqrt(6)`` for a rate (the spread of the difference
of two values each known to one count), ``LOSS_FLOOR`` (a hundredth of the default tolerance: the
fourth significant digit, beyond what the summary prints) otherwise.

Hard failures, whatever the statistics: a non-finite FP32 reference, a non-finite AMP loss window or
final metric, more than 5 % of an AMP run's steps skipped, and an FP16 scale collapse
(:mod:`ampkit.verify.band`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ampkit.verify.band import MAX_SKIP_SHARE, RunOutcome, band, hard_reasons, trainer_warnings
from ampkit.verify.figures import finite_mean, is_rate, seeds_text
from ampkit.verify.sequential import Looks
from ampkit.verify.stats import ALPHA, POWER, Effect, paired_effect

__all__ = ["judge", "Verdict", "tolerances", "uninformative", "infer_count", "TOLERANCE", "LOSS_SCALE_FLOOR",
           "LOSS_FLOOR", "WINDOWS", "ALPHA", "SETTINGS"]

TOLERANCE = 0.01
LOSS_SCALE_FLOOR = 0.1
LOSS_FLOOR = 1e-4
WINDOWS = 4
MAX_COUNT = 100_000  # infer_count looks no further
SETTINGS = {"alpha": ALPHA, "power": POWER, "tolerance": TOLERANCE, "loss_scale_floor": LOSS_SCALE_FLOOR,
            "loss_floor": LOSS_FLOOR,
            "windows": WINDOWS, "max_skip_share": MAX_SKIP_SHARE}


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """``verdict`` is "pass", "fail" or "inconclusive"; ``reasons`` say why it is not a pass, one sentence each."""

    verdict: str
    reasons: tuple[str, ...]
    warnings: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    band: dict[str, Any]  # the FP32 seed band of the plot (never the verdict)
    final_metric: dict[str, Any]
    skipped: dict[str, Any]
    effects: dict[str, Any] = field(default_factory=dict)  # the paired tests: endpoints, windows, settings
    exits: dict[int, int | None] = field(default_factory=dict)  # seed -> first logged step where AMP leaves FP32
    tolerance: float | None = None  # as given (None: the defaults): explain judges its reruns with it
    metric_count: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


# ---------------------------------------------------------------------------------------- tolerances
def infer_count(values: list[float]) -> int | None:
    """The smallest n <= MAX_COUNT such that every value is k / n (to float32 precision), or None.

    A value that is no count at all can fit some large n by chance; that only makes the floor on the spread
    tiny, since the default tolerance is the larger of 1 % and one counting error."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals or any(not 0.0 <= v <= 1.0 for v in vals):
        return None
    for n in range(1, MAX_COUNT + 1):
        if all(abs(v * n - round(v * n)) <= 2e-7 * n for v in vals):  # float32 k / n: within 6e-8 n
            return n if n > 1 or all(v in (0.0, 1.0) for v in vals) else None
    return None


def tolerances(name: str, fp32: list[float], amp: list[float], tolerance: float | None, count: int | None
               ) -> tuple[float, float, str]:
    """(relative tolerance, floor on the spread, how it was chosen) for the final metric."""
    finite = [v for v in fp32 if math.isfinite(v)]
    mean = abs(statistics.fmean(finite)) if finite else 0.0
    tol = TOLERANCE if tolerance is None else tolerance
    given = "(default)" if tolerance is None else "(--tolerance)"
    if is_rate(name, fp32 + amp) and mean > 0:
        inferred = count is None
        count = count or infer_count(fp32 + amp)
        if count:
            one = 1.0 / (count * mean)
            src = "inferred from the values" if inferred else "the task's"
            return tol, one / math.sqrt(6.0), (f"{tol:.3g} of the FP32 value {given}, {tol * count * mean:.3g} of "
                                               f"{count} test examples ({src})")
    return tol, LOSS_FLOOR, f"{tol:.3g} of the FP32 value {given}"


def uninformative(name: str, fp32: list[float], amp: list[float], tolerance: float | None, count: int | None,
                  higher: bool) -> str | None:
    """Why the final metric cannot tell the two precisions apart (then the loss decides), or None.

    >>> uninformative("accuracy", [0.5, 0.5], [0.5, 0.5], None, None, True)
    'it is 0.5 in every run of both precisions (it does not move)'
    >>> uninformative("accuracy", [0.96, 0.9733], [0.96, 0.9467], None, 75, True)[:40]
    'one counting error (1 of 75 test example'
    """
    vals = fp32 + amp
    if len(fp32) >= 2 and len(set(vals)) == 1:
        return f"it is {vals[0]:.4g} in every run of both precisions (it does not move)"
    tol = TOLERANCE if tolerance is None else tolerance
    finite = [v for v in fp32 if math.isfinite(v)]
    mean = abs(statistics.fmean(finite)) if finite else 0.0
    if not is_rate(name, vals) or mean <= 0:
        return None
    if higher and tol >= 1.0:
        return f"a tolerance of {tol:.0%} of a rate where higher is better cannot fail"
    n = count or infer_count(vals)
    if n and 1.0 / (n * mean) > tol:
        src = "the task's" if count else "inferred from the values"
        return (f"one counting error (1 of {n} test examples, {src}) is {1.0 / (n * mean):.3%} of the FP32 value, "
                f"coarser than the tolerance {tol:.3%}")
    return None


# ---------------------------------------------------------------------------------------- harms
def _harm(a: float, f: float, lower_is_better: bool, scale: float | None = None) -> float:
    """AMP's harm relative to ``scale`` (default ``|f|``): positive when AMP is worse."""
    diff = (a - f) if lower_is_better else (f - a)
    scale = abs(f) if scale is None else scale
    return diff / scale if scale > 1e-12 else diff


def _first_loss(run: RunOutcome) -> float:
    return next((float(p[1]) for p in run.curve if p[1] is not None and math.isfinite(p[1])), 0.0)


def _loss_scale(value: float, run: RunOutcome) -> float:
    """A loss is judged relative to itself, but never to less than LOSS_SCALE_FLOOR of the run's first logged loss."""
    return max(abs(value), LOSS_SCALE_FLOOR * abs(_first_loss(run)))


def _points(fp32: dict[int, RunOutcome], amp: dict[int, RunOutcome], seeds: list[int]) -> list[int]:
    """The logged steps every seed has, finite, in both precisions."""
    common = None
    for s in seeds:
        for r in (fp32[s], amp[s]):
            ok = {int(p[0]) for p in r.curve if p[1] is not None and math.isfinite(p[1])}
            common = ok if common is None else common & ok
    return sorted(common or ())


def _window_harms(fp32, amp, seeds, steps: list[int]) -> list[float]:
    out = []
    for s in seeds:
        f = {int(p[0]): p[1] for p in fp32[s].curve}
        a = {int(p[0]): p[1] for p in amp[s].curve}
        f_mean = statistics.fmean(f[k] for k in steps)
        out.append(_harm(statistics.fmean(a[k] for k in steps), f_mean, True, _loss_scale(f_mean, fp32[s])))
    return out


def _windows(fp32, amp, seeds, tol: float) -> list[Effect]:
    steps = _points(fp32, amp, seeds)
    k = min(WINDOWS, len(steps))
    if k == 0:
        return []
    bounds = [round(i * len(steps) / k) for i in range(k + 1)]
    return [paired_effect(_window_harms(fp32, amp, seeds, steps[lo:hi]), tolerance=tol, floor=LOSS_FLOOR,
                          alpha_fail=ALPHA / k, name=f"training loss, steps {steps[lo]}-{steps[hi - 1]}",
                          steps=(steps[lo], steps[hi - 1]))
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def _final_harms(fp32, amp, seeds, metric: str, higher: bool) -> list[float]:
    out = []
    for s in seeds:
        f, a = fp32[s].final, amp[s].final
        scale = _loss_scale(f, fp32[s]) if "loss" in metric else None
        out.append(_harm(a, f, not higher, scale))
    return out


def _endpoints(fp32, amp, seeds, metric: str, higher: bool, tolerance: float | None, count: int | None,
               looks: Looks | None = None) -> tuple[list[Effect], list[Effect], dict[str, Any]]:
    """(verdict endpoints, curve windows, how the tolerances were chosen). With ``looks`` (``--seeds auto``) the
    endpoints are judged at the sequential design's nominal levels (:mod:`ampkit.verify.sequential`)."""
    f_vals, a_vals = [fp32[s].final for s in seeds], [amp[s].final for s in seeds]
    loss_tol = TOLERANCE if tolerance is None else tolerance
    windows = _windows(fp32, amp, seeds, loss_tol)
    has_metric = all(math.isfinite(v) for v in f_vals + a_vals)
    how: dict[str, Any] = {"loss": f"{loss_tol:.3g} of the FP32 loss (at least {LOSS_SCALE_FLOOR:g} of its first "
                                   f"logged value) {'(default)' if tolerance is None else '(--tolerance)'}"}
    why = uninformative(metric, f_vals, a_vals, tolerance, count, higher) if has_metric and windows else None
    f_bad = finite_mean(f_vals, seeds)[1]
    if f_bad and any(math.isfinite(v) for v in f_vals + a_vals):  # said, not dropped in silence (issue 45)
        why = f"FP32's is not finite ({seeds_text(f_bad)})"
    if why:
        has_metric, how["metric_not_informative"] = False, why
    m = (1 if windows else 0) + (1 if has_metric else 0)
    endpoints = []
    a_pass, a_fail = ALPHA, ALPHA / max(m, 1)
    if looks is not None:  # one look of --seeds auto: the design's nominal levels (ampkit.verify.sequential)
        a_pass, a_fail = looks.level(a_pass), looks.level(a_fail)
    if has_metric:
        tol, floor, how["metric"] = tolerances(metric, f_vals, a_vals, tolerance, count)
        endpoints.append(paired_effect(_final_harms(fp32, amp, seeds, metric, higher), tolerance=tol, floor=floor,
                                       alpha_pass=a_pass, alpha_fail=a_fail, name=f"final {metric}"))
    if windows:
        w = windows[-1]
        endpoints.append(paired_effect(list(w.per_seed), tolerance=loss_tol, floor=LOSS_FLOOR, alpha_pass=a_pass,
                                       alpha_fail=a_fail, name=f"late training loss (steps {w.steps[0]}-{w.steps[1]})",
                                       steps=w.steps))
    return endpoints, windows, how


# ---------------------------------------------------------------------------------------- sentences
def _pct(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:+.3%}"


def describe(e: Effect, label: str) -> str:
    """One sentence: the effect, its interval, the tolerance and (inconclusive) the seeds that would decide it."""
    # The sign in words: a negative harm is "better by 0.195%", never "worse by -0.195%" (issue 45).
    way = "worse" if not math.isfinite(e.mean) or e.mean >= 0 else "better"
    size = _pct(abs(e.mean)).lstrip("+") if math.isfinite(e.mean) else "inf"
    head = (f"{e.name}: {label} {way} by {size} (upper bound {_pct(e.upper)}, lower {_pct(e.lower)}) "
            f"against a tolerance of {e.tolerance:.3%}, {e.n} seed{'s' if e.n != 1 else ''}")
    if e.decision == "fail":
        return head + ": beyond the tolerance"
    if e.decision == "pass":
        return head + ": within the tolerance"
    if e.n == 1:
        more = "one seed measures no spread; use --seeds 3 or more"
    elif e.seeds_to_decide is None:
        more = "the effect is too close to the tolerance to be told apart with a few seeds"
    else:
        more = f"about {e.seeds_to_decide} seeds would likely decide it (from the observed spread)"
    return head + f": the interval straddles the tolerance; {more}"


def _exits(windows: list[Effect], seeds: list[int], late_failed: bool, fp32, amp) -> dict[int, int | None]:
    """Per seed, the first step of the earliest window from which every window to the end is worse than FP32
    (the windows' Bonferroni lower bound above the tolerance); a non-finite AMP curve: its first bad step."""
    exits: dict[int, int | None] = {s: None for s in seeds}
    start = None
    for i in range(len(windows) - 1, -1, -1):
        if windows[i].decision != "fail":
            break
        start = i
    if start is None and late_failed and windows:
        start = len(windows) - 1
    if start is not None:
        w = windows[start]
        worst = max(range(len(seeds)), key=lambda j: w.per_seed[j])
        for j, s in enumerate(seeds):
            if w.per_seed[j] > w.tolerance or j == worst:
                exits[s] = w.steps[0]
    for s in seeds:
        bad = next((int(p[0]) for p in amp[s].curve if p[1] is None or not math.isfinite(p[1])), None)
        if bad is not None:
            exits[s] = bad
    return exits


# ---------------------------------------------------------------------------------------- the judge
def _metric_info(metric: str, higher: bool, fp32, amp, seeds, endpoints: list[Effect]) -> dict[str, Any]:
    f, a = [fp32[s].final for s in seeds], [amp[s].final for s in seeds]
    info: dict[str, Any] = {"name": metric, "higher_is_better": higher, "fp32": f, "amp": a, "allowed": None}
    if not f:
        return info
    # The means over the finite seeds, the others named (verify.figures): one NaN seed no longer hides the mean
    # of the rest behind "n/a" (issue 45). When the metric is judged every seed is finite and nothing changes.
    (f_mean, f_bad), (a_mean, a_bad) = finite_mean(f, seeds), finite_mean(a, seeds)
    info.update(fp32_mean=f_mean, amp_mean=a_mean, fp32_not_finite=f_bad, amp_not_finite=a_bad)
    e = next((x for x in endpoints if x.name == f"final {metric}"), None)
    if e is None or f_mean is None:
        return info
    margin = e.tolerance * abs(f_mean)
    info.update(margin=margin, margin_text=f"{e.tolerance:.3%} of the FP32 value",
                allowed=[f_mean - margin, f_mean + margin], effect=e.to_dict())
    return info


def judge(*, label: str, fp32: dict[int, RunOutcome], amp: dict[int, RunOutcome], metric: str,
          higher_is_better: bool, bf16_advice: str | None = None, tolerance: float | None = None,
          metric_count: int | None = None, looks: Looks | None = None) -> Verdict:
    """The verdict of the module docstring. ``fp32`` and ``amp`` map each seed to its run (paired by seed).
    ``looks``: this is one look of ``--seeds auto`` (:mod:`ampkit.verify.sequential`), judged at its nominal levels."""
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and 0 < tolerance < math.inf):
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    seeds = [s for s in fp32 if s in amp]
    hard = hard_reasons(fp32, amp, label, metric)
    warnings, collapse = trainer_warnings(amp, bf16_advice)
    hard += collapse
    notes: list[str] = []
    endpoints, windows, how = ([], [], {}) if hard or not seeds else _endpoints(
        fp32, amp, seeds, metric, higher_is_better, tolerance, metric_count, looks)
    reasons = list(hard)
    decisions = [e.decision for e in endpoints]
    reasons += [describe(e, label) for e in endpoints if e.decision != "pass"]
    if hard or "fail" in decisions:
        verdict = "fail"
    elif decisions and all(d == "pass" for d in decisions):
        verdict = "pass"
    else:
        verdict = "inconclusive"
        if not decisions and not hard:
            reasons.append("nothing to judge: the AMP and FP32 runs share no seed with finite logged losses")
    if how.get("metric_not_informative"):
        notes.append(f"final {metric} is not informative: {how['metric_not_informative']}; the training loss decides")
    if len(seeds) == 1:
        notes.append("one seed: no paired spread is measured, so the verdict cannot be a pass; use --seeds 3")
    late_failed = bool(endpoints) and endpoints[-1].decision == "fail"
    early = [w for w in windows[:-1] if w.decision == "fail"]
    if early and not late_failed:
        warnings.append({"code": "worse-early", "message": f"{label} was worse than FP32 early on "
                         f"({early[0].name}: {_pct(early[0].mean)}) and caught up by the end", "fix": "",
                         "seeds": list(seeds)})
    steps = max((r.steps for r in amp.values()), default=0)
    skipped = {"amp": {s: r.skipped for s, r in amp.items()}, "fp32": {s: r.skipped for s, r in fp32.items()},
               "steps": steps, "max_share": MAX_SKIP_SHARE}
    effects = {"method": "paired equivalence test (one-sided Student t over seeds)", "alpha": ALPHA, "power": POWER,
               "tolerance": how, "endpoints": [e.to_dict() for e in endpoints],
               "windows": [w.to_dict() for w in windows]}
    if looks is not None:
        effects["sequential"] = looks.to_dict()
    return Verdict(verdict=verdict, reasons=tuple(reasons), warnings=tuple(warnings), notes=tuple(notes),
                   band=band({s: r.curve for s, r in fp32.items()}),
                   final_metric={**_metric_info(metric, higher_is_better, fp32, amp, seeds, endpoints),
                                 "not_informative": how.get("metric_not_informative")}, skipped=skipped,
                   effects=effects, exits=_exits(windows, seeds, late_failed, fp32, amp) if seeds else {},
                   tolerance=tolerance, metric_count=metric_count)
