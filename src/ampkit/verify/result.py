"""The result of ``ampkit compare``: :class:`CompareResult`, what ``compare.json`` holds.

Its own module so that :mod:`ampkit.verify.compare` (which builds it) and :mod:`ampkit.verify.report`
(which draws it) both import it, and neither imports the other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CompareResult", "finite_or_none"]


@dataclass(frozen=True, kw_only=True)
class CompareResult:
    """The verdict and everything behind it. ``to_dict()`` is what ``compare.json`` holds."""

    verdict: str  # "pass" | "fail" | "inconclusive"
    reasons: tuple[str, ...]
    warnings: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    task: str
    task_description: str
    precision: str
    precision_reason: str
    seeds: tuple[int, ...]
    steps: int
    log_every: int
    device: dict[str, Any]
    versions: dict[str, Any]
    curves: dict[str, dict[int, list[list[float | None]]]]
    band: dict[str, Any]
    final_metric: dict[str, Any]
    throughput: dict[str, Any]
    memory: dict[str, Any]
    ratios: dict[str, float | None]
    skipped: dict[str, Any]
    scale_trace: dict[int, list[list[float]]] | None
    audit: dict[str, Any] | None
    margins: dict[str, float]
    wall_s: float
    report: str | None = None
    files: tuple[str, ...] = field(default_factory=tuple)
    fp32_modules: tuple[str, ...] = ()  # the AMP runs' FP32 regions, as given
    regions: dict[str, Any] | None = None  # matched module names and the cost of each region
    explain: dict[str, Any] | None = None  # compare --explain: ranking, candidates, recommendation
    source: dict[str, Any] | None = None  # compare SCRIPT: {"kind": "script", "script", "args", ...}; None for a task
    effects: dict[str, Any] = field(default_factory=dict)  # the paired tests behind the verdict (verify.judge)
    continuation: dict[str, Any] | None = None  # the settings and per-run records compare --continue reuses

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["curves"] = {k: {str(s): v for s, v in c.items()} for k, c in self.curves.items()}
        if self.scale_trace is not None:
            d["scale_trace"] = {str(s): v for s, v in self.scale_trace.items()}
        d["reasons"], d["warnings"], d["notes"], d["seeds"], d["files"], d["fp32_modules"] = (
            list(self.reasons), list(self.warnings), list(self.notes), list(self.seeds), list(self.files),
            list(self.fp32_modules))
        return finite_or_none(d)


def finite_or_none(obj: Any) -> Any:
    """NaN/Inf become None so that compare.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
