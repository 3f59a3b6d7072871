"""The final metric's mean per precision, as every view shows it (the terminal summary, the HTML report's card,
``compare.json``): the mean over the seeds whose final value is finite, and the seeds whose value is not.

A single non-finite seed used to make the whole mean NaN, which compare.json stores as null and the report
showed as "n/a", next to a verdict that was computed from the very runs behind it (issue 45). Here a mean is
a number whenever one seed has one, and the seeds left out are named in the same words in every view.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["allowed_text", "finite_mean", "is_rate", "mean_text", "metric_format", "seeds_text"]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def finite_mean(values: Sequence[float | None], seeds: Sequence[int]) -> tuple[float | None, list[int]]:
    """(the mean of the finite values or None when there is none, the seeds whose value is not finite)."""
    finite = [float(v) for v in values if _finite(v)]
    bad = [int(s) for s, v in zip(seeds, values) if not _finite(v)]
    return (statistics.fmean(finite) if finite else None), bad


def mean_text(final_metric: dict[str, Any], side: str, fmt: Callable[[float], str]) -> str:
    """``side``'s ("fp32" or "amp") mean of ``final_metric`` (the judge's dict) for a person, formatted by ``fmt``:
    "0.8916", "0.8916 (seed 2 not finite)", "not finite (seeds 0, 1)"; "none" when there are no runs."""
    mean = final_metric.get(f"{side}_mean")
    bad = list(final_metric.get(f"{side}_not_finite") or [])
    if not _finite(mean):
        values = final_metric.get(side) or []
        if not values:
            return "none"
        return f"not finite ({seeds_text(bad)})" if bad else "not finite"
    return fmt(mean) + (f" ({seeds_text(bad)} not finite)" if bad else "")


def seeds_text(seeds: Sequence[int]) -> str:
    """"seed 1", "seeds 0, 2": how every view names the seeds a figure leaves out."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def is_rate(name: str, values: Sequence[float]) -> bool:
    """A metric read as a rate (a share of test examples): every value in [0, 1] and not a loss. The judge sizes
    its tolerance by it, and every view writes such a metric as a percentage."""
    return bool(values) and all(0.0 <= v <= 1.0 for v in values) and "loss" not in name


def metric_format(final_metric: dict[str, Any]) -> Callable[[float], str]:
    """How every view writes one value of the final metric: a rate (:func:`is_rate` of its finite values) as a
    percentage with two decimals, anything else to 4 significant digits. One rule, so that the terminal and the
    report never show the same figure two ways."""
    vals = [v for v in (final_metric.get("fp32") or []) + (final_metric.get("amp") or []) if _finite(v)]
    if is_rate(str(final_metric.get("name")), vals):
        return lambda v: f"{v:.2%}"
    return lambda v: f"{v:.4g}"


def allowed_text(final_metric: dict[str, Any], fmt: Callable[[float], str]) -> str:
    """The bound the final metric is judged against ("allowed >= 89.16%"), that it is not judged ("not
    informative: the loss decides"), or "" when neither applies: the terminal summary and the report's card."""
    if final_metric.get("not_informative"):
        return "not informative: the loss decides"
    allowed = final_metric.get("allowed")
    if not allowed:
        return ""
    higher = bool(final_metric.get("higher_is_better"))
    return f"allowed {'>=' if higher else '<='} {fmt(allowed[0] if higher else allowed[1])}"
