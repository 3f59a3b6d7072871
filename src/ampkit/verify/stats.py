"""The statistics of the paired verdict, as pure functions of per-seed numbers (no torch, no scipy).

For one judged quantity (the final metric, the loss over a window of the curve) ``compare`` has, for
each seed k, the **harm** ``h_k``: how much worse the AMP run is than the FP32 run *of the same seed*
(same initial weights, same batches), relative to the FP32 value. The seeds are independent
replicates, so ``mean(h)`` estimates the effect of the precision and ``sd(h) / sqrt(n)`` its standard
error; pairing removes the seed-to-seed spread of training itself (on digits, BF16 on the CPU: the late
training loss moves by about 2 % between the precisions of one seed and by 30 % between seeds; the test
accuracy by 0 to 2 of 359 images within a seed, over a 5-image range between 5 seeds).

:func:`paired_effect` is an equivalence test against a tolerance ``tol`` (the harm you accept), with
one-sided Student-t bounds on ``n - 1`` degrees of freedom:

* ``upper = mean + t(1 - alpha_pass, n-1) * s / sqrt(n)``: **pass** when ``upper < tol`` (the harm is
  below the tolerance with confidence ``1 - alpha_pass``);
* ``lower = mean - t(1 - alpha_fail, n-1) * s / sqrt(n)``: **fail** when ``lower > tol``;
* otherwise **inconclusive**: the interval straddles the tolerance, and :func:`seeds_to_decide` says
  about how many seeds would decide it at the observed mean and spread (with ``POWER`` probability).

``s = max(sd(h), floor)``: the floor is the resolution of the quantity (a counting error for an
accuracy, a hundredth of the default loss tolerance for a loss), so that identical runs do not give an
interval of zero width. The half-width ``t(1 - a, n-1) / sqrt(n) * s`` falls strictly with ``n`` at a
given ``s`` (both factors do): more seeds can only sharpen the verdict.

With **one seed** there is no spread to measure. The verdict is then never "pass"; it is "fail" only
when the one difference is beyond the tolerance by ``z(1 - alpha_fail) * tol``, i.e. taking the paired
spread to be at most the tolerance itself (a stated assumption, not a measurement; measured paired
spreads on digits and charlm are well below it); otherwise inconclusive.

>>> e = paired_effect([0.001, -0.002, 0.0005], tolerance=0.01, floor=1e-4)
>>> e.decision, round(e.upper, 4) < 0.01
('pass', True)
>>> paired_effect([0.30, 0.28, 0.33], tolerance=0.01, floor=1e-4).decision
'fail'
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

__all__ = ["ALPHA", "POWER", "MAX_SEEDS", "t_quantile", "t_cdf", "half_width", "detectable", "seeds_to_decide",
           "Effect", "paired_effect"]

ALPHA = 0.05  # one-sided: a PASS is wrong at most 5 % of the time at a harm equal to the tolerance
POWER = 0.8  # for the smallest detectable effect and the seeds that would decide an inconclusive verdict
MAX_SEEDS = 1000  # seeds_to_decide gives up (None) beyond this


# ---------------------------------------------------------------------------------------- Student t
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``df`` >= 1), to about 1e-10 (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def half_width(sd: float, n: int, alpha: float = ALPHA) -> float:
    """``t(1 - alpha, n - 1) * sd / sqrt(n)``: the one-sided bound's distance from the mean (inf below 2 seeds)."""
    if n < 2:
        return math.inf
    return t_quantile(1.0 - alpha, n - 1) * sd / math.sqrt(n)


def detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """How far from the tolerance a true harm must be for this many seeds to decide it with ``power``."""
    if n < 2:
        return math.inf
    return (t_quantile(1.0 - alpha, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_to_decide(mean: float, sd: float, tolerance: float, *, alpha_pass: float = ALPHA,
                    alpha_fail: float = ALPHA, power: float = POWER, at_least: int = 2) -> int | None:
    """About how many seeds would decide the test (with ``power``) if the harm were ``mean`` and its spread ``sd``;
    None beyond :data:`MAX_SEEDS` (the mean is too close to the tolerance to be told apart)."""
    gap = abs(tolerance - mean)
    alpha = alpha_pass if mean < tolerance else alpha_fail
    lo = max(2, at_least)
    if gap <= 0.0 or detectable(sd, MAX_SEEDS, alpha, power) >= gap:
        return None
    if detectable(sd, lo, alpha, power) < gap:
        return lo
    hi = MAX_SEEDS  # detectable() falls with n: bisect for the first n below the gap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if detectable(sd, mid, alpha, power) < gap:
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------------------- one quantity
@dataclass(frozen=True, kw_only=True)
class Effect:
    """The paired test of one quantity. Harms are relative to the FP32 value; positive means AMP is worse."""

    name: str
    n: int
    per_seed: tuple[float, ...]
    mean: float
    sd: float  # the observed sample standard deviation of the harms (0 for one seed)
    sd_used: float  # max(sd, floor)
    floor: float
    tolerance: float
    upper: float  # one-sided upper bound at alpha_pass (inf for one seed)
    lower: float  # one-sided lower bound at alpha_fail
    alpha_pass: float
    alpha_fail: float
    decision: str  # "pass" | "fail" | "inconclusive"
    detectable: float | None  # smallest distance from the tolerance these seeds resolve (POWER); None: one seed
    seeds_to_decide: int | None  # inconclusive only: seeds that would likely decide it; None: more than MAX_SEEDS
    steps: tuple[int, int] | None = None  # the first and last logged step of a window of the curve

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_seed"] = list(self.per_seed)
        d["steps"] = list(self.steps) if self.steps else None
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _z(p: float) -> float:
    return t_quantile(p, 1e7)


def paired_effect(harms: Sequence[float], *, tolerance: float, floor: float, alpha_pass: float = ALPHA,
                  alpha_fail: float = ALPHA, name: str = "", steps: tuple[int, int] | None = None) -> Effect:
    """The equivalence test of the module docstring on the per-seed harms."""
    h = [float(x) for x in harms]
    n = len(h)
    if n == 0 or not tolerance > 0 or not all(math.isfinite(x) for x in h):
        raise ValueError(f"paired_effect needs finite harms and a positive tolerance, got {h}, {tolerance}")
    mean = statistics.fmean(h)
    sd = statistics.stdev(h) if n > 1 else 0.0
    s = max(sd, floor)
    if n == 1:  # no spread measured: assume it is at most the tolerance; never a pass
        upper, lower = math.inf, mean - _z(1.0 - alpha_fail) * tolerance
    else:
        upper, lower = mean + half_width(s, n, alpha_pass), mean - half_width(s, n, alpha_fail)
    decision = "pass" if upper < tolerance else "fail" if lower > tolerance else "inconclusive"
    needed = None
    if decision == "inconclusive":
        needed = seeds_to_decide(mean, s if n > 1 else max(s, tolerance), tolerance, alpha_pass=alpha_pass,
                                 alpha_fail=alpha_fail, at_least=n + 1)
    det = detectable(s, n, alpha_pass) if n > 1 else None
    return Effect(name=name, n=n, per_seed=tuple(h), mean=mean, sd=sd, sd_used=s, floor=floor, tolerance=tolerance,
                  upper=upper, lower=lower, alpha_pass=alpha_pass, alpha_fail=alpha_fail, decision=decision,
                  detectable=det, seeds_to_decide=needed, steps=steps)
