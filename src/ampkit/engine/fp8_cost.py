"""The FP8 cost model: what a linear layer costs in BF16 and in FP8 on this card, from a measured probe.

A probe (:mod:`ampkit.engine.fp8_probe`) times one ``nn.Linear`` forward + backward (its three GEMMs:
``y = x W^T``, ``dx = dy W``, ``dW = dy^T x``, and for FP8 the scales and casts around them) in BF16 and
as torchao's ``Float8Linear`` at a few shapes ``(M, K, N)`` (M tokens, K in-features, N out-features),
eagerly or under ``torch.compile`` (the casts fuse into neighbouring kernels there, so the two differ a lot).
The model is an interpolation table over the GEMM size ``log2(M*K*N)``:

* the FP8/BF16 time ratio is interpolated linearly between the probed sizes and held at the end values
  outside them (a layer bigger than every probed shape is predicted to gain what the biggest one gained);
* the BF16 time is interpolated (and extrapolated) linearly in log-time over log-size.

A layer is predicted to pay when its ratio is below ``1 - MIN_GAIN``.

Models are cached per card, torch and torchao version, recipe and mode in one JSON file, each with its
provenance (``probe`` or ``recorded``, when, the ampkit commit): a different card or torch version finds no
entry and probes again. The file is ``$AMPKIT_FP8_COST_CACHE`` when set, else
``$XDG_CACHE_HOME/ampkit/fp8-cost.json`` (``~/.cache/ampkit/fp8-cost.json``). An unreadable file is
ignored (and rewritten by the next probe), never an error.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampkit.atomic import atomic_write_bytes

__all__ = ["MIN_GAIN", "MODES", "Timing", "CostModel", "cache_path", "cache_key", "load_cached", "save_cached"]

MIN_GAIN = 0.03  # a layer converts only when FP8 is predicted at least 3% faster: noise is not a gain
MODES = ("eager", "compiled")
SCHEMA = 1


@dataclass(frozen=True)
class Timing:
    """One probed shape: a linear layer's forward + backward in BF16 and in FP8, milliseconds."""

    m: int
    k: int
    n: int
    bf16_ms: float
    fp8_ms: float

    @property
    def size(self) -> float:
        return math.log2(self.m * self.k * self.n)


def _interp(xs: list[float], ys: list[float], x: float, *, extrapolate: bool) -> float:
    if len(xs) == 1:
        return ys[0]
    if x <= xs[0] or x >= xs[-1]:
        if not extrapolate:
            return ys[0] if x <= xs[0] else ys[-1]
        i = 0 if x <= xs[0] else len(xs) - 2
    else:
        i = next(j for j in range(len(xs) - 1) if xs[j] <= x <= xs[j + 1])
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class CostModel:
    """Predicted BF16 and FP8 milliseconds of a linear layer's forward + backward at ``(M, K, N)``.

    ``key``: card, capability, torch, torchao, recipe, mode (what the figures hold for);
    ``provenance``: ``source`` (``probe``: measured here; ``recorded``: from a file), ``measured`` (ISO date),
    ``ampkit_commit``, and for a probe its ``probe_s``.
    """

    key: dict[str, Any]
    timings: tuple[Timing, ...]
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        good = [t for t in self.timings if t.bf16_ms > 0 and t.fp8_ms > 0 and min(t.m, t.k, t.n) > 0]
        if not good:
            raise ValueError("a cost model needs at least one timing with positive times")
        object.__setattr__(self, "timings", tuple(sorted(good, key=lambda t: t.size)))

    def _table(self) -> tuple[list[float], list[float], list[float]]:
        by_size: dict[float, list[Timing]] = {}
        for t in self.timings:  # shapes of one size are averaged
            by_size.setdefault(round(t.size, 6), []).append(t)
        xs = sorted(by_size)
        ratio = [sum(t.fp8_ms / t.bf16_ms for t in by_size[x]) / len(by_size[x]) for x in xs]
        log_bf16 = [sum(math.log(t.bf16_ms) for t in by_size[x]) / len(by_size[x]) for x in xs]
        return xs, ratio, log_bf16

    def ratio(self, m: int, k: int, n: int) -> float:
        """Predicted FP8 time over BF16 time (below 1: FP8 is faster)."""
        xs, ratio, _ = self._table()
        return _interp(xs, ratio, math.log2(m * k * n), extrapolate=False)

    def predict(self, m: int, k: int, n: int) -> tuple[float, float]:
        """``(bf16_ms, fp8_ms)`` for a linear layer of K in, N out features over M tokens."""
        xs, _, log_bf16 = self._table()
        bf16 = math.exp(_interp(xs, log_bf16, math.log2(m * k * n), extrapolate=True))
        return bf16, bf16 * self.ratio(m, k, n)

    def pays(self, m: int, k: int, n: int) -> bool:
        return self.ratio(m, k, n) < 1.0 - MIN_GAIN

    @property
    def mode(self) -> str:
        return str(self.key.get("mode"))

    def source(self) -> str:
        """``"probe on NVIDIA H200 (torch 2.11.0, torchao 0.18.0, compiled), 2026-12-02"``."""
        k, p = self.key, self.provenance
        when = str(p.get("measured", "date unknown"))[:10]
        return (f"{p.get('source', 'unknown')} on {k.get('card')} (torch {k.get('torch')}, torchao {k.get('torchao')}, "
                f"{k.get('mode')}), {when}")

    def to_dict(self) -> dict[str, Any]:
        return {"key": dict(self.key), "provenance": dict(self.provenance),
                "timings": [[t.m, t.k, t.n, t.bf16_ms, t.fp8_ms] for t in self.timings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModel":
        timings = tuple(Timing(int(m), int(k), int(n), float(b), float(f)) for m, k, n, b, f in data["timings"])
        return cls(key=dict(data["key"]), timings=timings, provenance=dict(data.get("provenance", {})))


def cache_path() -> Path:
    """Where cost models are cached: ``$AMPKIT_FP8_COST_CACHE``, else the user's cache folder."""
    if os.environ.get("AMPKIT_FP8_COST_CACHE"):
        return Path(os.environ["AMPKIT_FP8_COST_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ampkit" / "fp8-cost.json"


def cache_key(*, card: str, capability: Any, torch: str, torchao: str | None, recipe: str, mode: str) -> dict[str, Any]:
    """What a cost model holds for: a model probed elsewhere, or under other versions, is not reused."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cap = list(capability) if capability is not None else None
    return {"card": card, "capability": cap, "torch": torch, "torchao": torchao, "recipe": recipe, "mode": mode}


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
        entries = data["entries"] if data.get("schema") == SCHEMA else []
        return [e for e in entries if isinstance(e, dict) and "key" in e and "timings" in e]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # missing, unreadable or another schema: as if empty (the next probe rewrites it)


def load_cached(key: dict[str, Any], path: Path | None = None) -> CostModel | None:
    """The cached model for exactly ``key``, or None."""
    for entry in _entries(path or cache_path()):
        if entry["key"] == key:
            try:
                return CostModel.from_dict(entry)
            except (ValueError, KeyError, TypeError):
                return None
    return None


def save_cached(model: CostModel, path: Path | None = None) -> Path:
    """Add (or replace) ``model``'s entry, keeping the others; written atomically."""
    path = path or cache_path()
    entries = [e for e in _entries(path) if e["key"] != model.key] + [model.to_dict()]
    data = (json.dumps({"schema": SCHEMA, "entries": entries}, indent=1) + "\n").encode()
    return atomic_write_bytes(path, lambda fh: fh.write(data))
