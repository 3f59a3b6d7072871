"""A speed ratio with its spread: what ``compare`` and ``bench`` say about "how much faster".

One measured ratio is not a fact on a busy machine: per-seed samples/s of the same run can differ by
3x. :func:`speed_ratio` pairs the measurements (seed s in AMP over seed s in FP32, or round r of a runner
over round r of the reference: each pair ran back to back on the same machine state), and returns the
median ratio, the spread of the pairs and whether that spread covers 1.0 ("within noise"). With one pair
no spread was measured, and the text says so. :meth:`SpeedRatio.text` is the one wording every renderer uses.
Nothing here names a cause: a slowdown's reason is only given where it was measured.

>>> from ampkit.training.speed import speed_ratio
>>> speed_ratio([1233, 600, 409], [800, 790, 805]).text()
'0.76x (0.51x-1.54x over 3 seeds: within noise)'
>>> speed_ratio([900], [450]).text()
'2.00x (one seed: no spread measured)'
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["SpeedRatio", "speed_ratio", "describe", "fmt_rate"]


@dataclass(frozen=True)
class SpeedRatio:
    """Paired ratios (``fast / reference``: above 1 is faster), their median and spread."""

    pairs: tuple[float, ...]
    unit: str = "seed"  # what one pair is: "seed", "round"

    @property
    def median(self) -> float | None:
        return statistics.median(self.pairs) if self.pairs else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """(lowest, highest) pair with two or three pairs; from four on the middle half of the pairs (quartiles),
        so that one seed caught by a load spike does not stretch it ("1.21x (1.14x-4.46x)", issue 45); None
        with fewer than two pairs (no spread was measured)."""
        if len(self.pairs) < 2:
            return None
        if len(self.pairs) < 4:
            return (min(self.pairs), max(self.pairs))
        q1, _, q3 = statistics.quantiles(self.pairs, n=4, method="inclusive")
        return (q1, q3)

    @property
    def within_noise(self) -> bool | None:
        """True when the pairs' spread (see :attr:`spread`) covers 1.0 (the run cannot tell faster from slower); None unmeasured."""
        s = self.spread
        return None if s is None else s[0] <= 1.0 <= s[1]

    def text(self) -> str:
        """``"1.81x (1.70x-1.95x over 3 seeds)"``, ``"... : within noise)"`` or ``"... (one seed: no spread measured)"``."""
        if self.median is None:
            return "n/a"
        s = self.spread
        if s is None:
            return f"{self.median:.2f}x (one {self.unit}: no spread measured)"
        noise = ": within noise" if self.within_noise else ""
        part = "middle half of" if len(self.pairs) >= 4 else "over"
        return f"{self.median:.2f}x ({s[0]:.2f}x-{s[1]:.2f}x {part} {len(self.pairs)} {self.unit}s{noise})"

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "spread": list(self.spread) if self.spread else None, "pairs": list(self.pairs),
                "range": [min(self.pairs), max(self.pairs)] if len(self.pairs) >= 2 else None,
                "unit": self.unit, "within_noise": self.within_noise}


def speed_ratio(fast: Sequence[float | None], reference: Sequence[float | None], *, unit: str = "seed"
                ) -> SpeedRatio:
    """Pair ``fast[i] / reference[i]`` (rates: samples/s; for times pass them the other way round), dropping
    pairs where either side is missing, zero or not finite."""
    pairs = tuple(a / b for a, b in zip(fast, reference)
                  if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0)
    return SpeedRatio(pairs=pairs, unit=unit)


def describe(info: dict[str, Any] | None, fallback: float | None = None) -> str:
    """The text of a :meth:`SpeedRatio.to_dict` read back from JSON (``compare.json``'s ``ratios``), or of a
    bare ratio when only that is known (then it says no spread was measured)."""
    if info and info.get("pairs"):
        return SpeedRatio(pairs=tuple(info["pairs"]), unit=info.get("unit", "seed")).text()
    if fallback is None:
        return "n/a"
    return f"{fallback:.2f}x (no spread measured)"


def fmt_rate(v: float | None, digits: int = 3) -> str:
    """A rate (samples/s, steps/s, TFLOP/s) with ``digits`` significant digits, never shown as 0 or 1 from rounding:
    ``1234.5 -> "1,234"``, ``1.37 -> "1.37"``, ``0.0042 -> "0.0042"`` (issue 45: "1 | 1" and "0")."""
    if v is None or not math.isfinite(v):
        return "n/a"
    if v == 0:
        return "0"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if "e" not in f"{v:.{digits}g}" else f"{v:.{digits - 1 + max(0, -math.floor(math.log10(abs(v))))}f}"
