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

__all__ = ["finite_mean", "mean_text", "metric_format"]


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
        return f"not finite ({_seeds(bad)})" if bad else "not finite"
    return fmt(mean) + (f" ({_seeds(bad)} not finite)" if bad else "")


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def metric_format(final_metric: dict[str, Any]) -> Callable[[float], str]:
    """How every view writes one value of the final metric: a rate (every finite value in [0, 1], not a loss: the
    judge's own reading, ``judge._is_rate``) as a percentage with two decimals, anything else to 4 significant
    digits. One rule, so that the terminal and the report never show the same figure two ways."""
    vals = [v for v in (final_metric.get("fp32") or []) + (final_metric.get("amp") or []) if _finite(v)]
    if vals and all(0 <= v <= 1 for v in vals) and "loss" not in str(final_metric.get("name")):
        return lambda v: f"{v:.2%}"
    return lambda v: f"{v:.4g}"
