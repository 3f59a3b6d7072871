"""FP8 decided by timing the user's own model: a short measured trial of a few layer sets, the fastest kept.

An isolated ``nn.Linear`` probe (:mod:`ampkit.engine.fp8_cost`) cannot see what ``torch.compile`` does around a
layer in a real model (the casts to FP8 fuse into the norms and activations): on Hugging Face's Llama at the
TinyLlama-1.1B shape the probe predicted every layer slower in FP8 while FP8 on every eligible layer made the
compiled step 1.107x faster. So the decision is measured where it pays, on the model:

* :func:`candidates`: BF16 (nothing converted), FP8 on every eligible layer, the cost model's pick, and layer sets
  that keep the attention projections or the first and last blocks in BF16. The cost model only orders and prunes
  them (duplicates and empty sets go, at most ``limit`` are tried); it never decides.
* :func:`run_trial`: each candidate is built once (its warm-up compiles it), then timed in a few interleaved
  rounds (the order reversed every other round), so a drifting clock weighs on every candidate alike.
* :func:`judge`: the fastest wins only if it beats BF16 by more than the spread of the rounds (the larger of the
  two candidates') **and** by at least ``min_gain`` (3 %); otherwise BF16 stays, with the measured reason.

Timing is passed in (``measure(candidate) -> timer``, each ``timer()`` returning milliseconds per step): the
real one trains copies of the model (:class:`ampkit.engine.fp8_trial_steps.StepTrial`), tests pass their own.
Results are cached per model structure, batch shapes, card, mode, recipe and versions
(:mod:`ampkit.engine.fp8_trial_cache`), with provenance.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from ampkit.engine.fp8 import FP8Filter, FP8Report, plan
from ampkit.engine.fp8_cost import CostModel
from ampkit.errors import first_line

__all__ = ["MIN_GAIN", "Candidate", "Measured", "TrialResult", "candidates", "judge", "run_trial", "BF16"]

MIN_GAIN = 0.03  # below 3 % a gain is not worth FP8's coarser numerics, whatever the spread
BF16 = "bf16"
ELIGIBLE = "fp8-eligible"
# Attention projections by their last name part (Llama/Mistral/Qwen, GPT-NeoX, BERT, timm, torch, ...).
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv", "qkv_proj", "query", "key", "value", "out_proj",
             "wq", "wk", "wv", "wo", "c_attn", "query_key_value")
_BLOCK = re.compile(r"^(.*?)\.(\d+)\.")
Timer = Callable[[], float]
Measure = Callable[["Candidate"], Timer]
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Candidate:
    """One layer set to time: its name, the layers in FP8 (empty: BF16) and why it is worth trying."""

    name: str
    converted: tuple[str, ...]
    why: str
    predicted: float | None = None  # the cost model's speedup on the linear layers, None without one


@dataclass(frozen=True)
class Measured:
    """A candidate's milliseconds per step, one figure per round."""

    name: str
    converted: int
    ms_rounds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.ms_rounds)

    @property
    def spread(self) -> float:
        """Max minus min over the rounds, milliseconds (0 with one round)."""
        return max(self.ms_rounds) - min(self.ms_rounds)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "converted": self.converted, "ms_rounds": list(self.ms_rounds),
                "ms_median": self.median, "ms_spread": self.spread}


@dataclass(frozen=True)
class TrialResult:
    """What the trial tried, what each cost, the winner and why; ``trial_s``: what the decision cost in seconds."""

    mode: str
    recipe: str
    rows: tuple[Measured, ...]
    winner: str
    converted: tuple[str, ...]
    reason: str
    trial_s: float
    tried: tuple[Candidate, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    cached: str | None = None  # where it was read from, None: measured in this run
    failed: tuple[tuple[str, str], ...] = ()  # (candidate, error) for those that could not be built or run

    @property
    def fp8(self) -> bool:
        return self.winner != BF16

    def row(self, name: str) -> Measured | None:
        return next((r for r in self.rows if r.name == name), None)

    def summary(self) -> str:
        """One line: what was tried (median ms and spread each), the verdict and what the trial cost."""
        parts = [f"{r.name} {r.median:.2f} ms (spread {r.spread:.2f})" for r in self.rows]
        how = (f"cached from a trial of {self.trial_s:.0f} s on {str(self.provenance.get('measured', '?'))[:10]} "
               f"({self.cached})" if self.cached else f"trial took {self.trial_s:.0f} s")
        failed = "".join(f"; {n} failed: {e}" for n, e in self.failed)
        return f"FP8 trial ({self.mode}, {self.recipe}): {'; '.join(parts)}{failed}: {self.reason}; {how}"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "recipe": self.recipe, "rows": [r.to_dict() for r in self.rows],
                "winner": self.winner, "converted": list(self.converted), "reason": self.reason,
                "trial_s": self.trial_s, "provenance": dict(self.provenance), "cached": self.cached,
                "failed": [list(f) for f in self.failed],
                "tried": [{"name": c.name, "converted": list(c.converted), "why": c.why, "predicted": c.predicted}
                          for c in self.tried]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, cached: str | None = None) -> "TrialResult":
        rows = tuple(Measured(r["name"], int(r["converted"]), tuple(float(x) for x in r["ms_rounds"]))
                     for r in data["rows"])
        tried = tuple(Candidate(c["name"], tuple(c["converted"]), c["why"], c.get("predicted"))
                      for c in data.get("tried", ()))
        return cls(mode=data["mode"], recipe=data["recipe"], rows=rows, winner=data["winner"],
                   converted=tuple(data["converted"]), reason=data["reason"], trial_s=float(data["trial_s"]),
                   tried=tried, provenance=dict(data.get("provenance", {})), cached=cached,
                   failed=tuple((str(n), str(e)) for n, e in data.get("failed", ())))


def _is_attention(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] in ATTENTION or any(p in ("attn", "attention", "self_attn", "self_attention") for p in parts)


def _blocks(names: tuple[str, ...]) -> tuple[str, str] | None:
    """The name prefixes of the first and last block (``layers.0.``, ``layers.21.``) of the longest numbered
    stack, or None when the model has fewer than three blocks."""
    stacks: dict[str, set[int]] = {}
    for n in names:
        m = _BLOCK.match(n)
        if m:
            stacks.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not stacks:
        return None
    prefix, idx = max(stacks.items(), key=lambda kv: len(kv[1]))
    if len(idx) < 3:
        return None
    return f"{prefix}.{min(idx)}.", f"{prefix}.{max(idx)}."


def _speedup(cost: CostModel | None, tokens: int | None, predicted: dict[str, tuple[float, float]],
             converted: tuple[str, ...]) -> float | None:
    if cost is None or not predicted:
        return None
    chosen = set(converted)
    bf16 = sum(b for b, _ in predicted.values())
    mixed = sum(f if n in chosen else b for n, (b, f) in predicted.items())
    return bf16 / mixed if mixed > 0 else None


def candidates(model: nn.Module, *, recipe: str, filter: FP8Filter | None = None, cost: CostModel | None = None,
               tokens: int | None = None, limit: int = 3) -> list[Candidate]:
    """The layer sets worth timing, BF16 and FP8-on-every-eligible-layer first, then the others ordered by the
    cost model's predicted speedup (without one: in the order below), at most ``limit`` in all."""
    eligible = plan(model, filter, recipe=recipe)
    if not eligible.converted:
        return [Candidate(BF16, (), "no linear layer is eligible for FP8")]
    predicted: dict[str, tuple[float, float]] = {}
    others: list[Candidate] = []
    if cost is not None and tokens:
        costed = plan(model, filter, recipe=recipe, tokens=tokens, cost=cost)
        predicted = {n: (b, f) for n, b, f in costed.predicted}
        others.append(Candidate("cost-model", costed.converted, f"the layers the cost model predicts faster "
                                                                f"({cost.source()})"))
    attn = tuple(n for n in eligible.converted if not _is_attention(n))
    others.append(Candidate("attention-bf16", attn, "attention projections kept in BF16"))
    ends = _blocks(eligible.converted)
    if ends is not None:
        keep = tuple(n for n in eligible.converted if not n.startswith(ends))
        others.append(Candidate("ends-bf16", keep, f"first and last blocks ({ends[0]}*, {ends[1]}*) kept in BF16"))
    base = [Candidate(BF16, (), "the reference"),
            Candidate(ELIGIBLE, eligible.converted, "every eligible linear layer in FP8")]
    seen = {c.converted for c in base}
    pruned = []
    for c in others:
        if not c.converted or c.converted in seen:
            continue  # nothing in FP8 (that is BF16), or a layer set already tried
        seen.add(c.converted)
        pruned.append(c)
    if predicted:  # the cost model orders what is left; it never decides
        pruned.sort(key=lambda c: -(_speedup(cost, tokens, predicted, c.converted) or 0.0))
    out = base + pruned
    return [Candidate(c.name, c.converted, c.why, _speedup(cost, tokens, predicted, c.converted))
            for c in out[:max(2, limit)]]


def judge(rows: list[Measured] | tuple[Measured, ...], *, min_gain: float = MIN_GAIN) -> tuple[str, str]:
    """The winner's name and the reason: the fastest by median, if it beats BF16 by more than the spread (the
    larger of the two) and by at least ``min_gain``; else BF16."""
    ref = next((r for r in rows if r.name == BF16), None)
    if ref is None:
        raise ValueError("a trial needs its BF16 row")
    best = min(rows, key=lambda r: r.median)
    if best.name == BF16 or len(rows) == 1:
        return BF16, f"BF16 was fastest ({ref.median:.2f} ms a step)"
    gain = 1.0 - best.median / ref.median
    noise = max(best.spread, ref.spread)
    vs = f"{best.name} {best.median:.2f} vs BF16 {ref.median:.2f} ms a step ({gain:+.1%})"
    if ref.median - best.median <= noise:
        return BF16, f"BF16 kept: {vs} is within the spread of the rounds ({noise:.2f} ms)"
    if gain < min_gain:
        return BF16, f"BF16 kept: {vs} is below the {min_gain:.0%} a gain must reach"
    return best.name, f"{vs}, beyond the spread ({noise:.2f} ms) and >= {min_gain:.0%}"


def run_trial(cands: list[Candidate], measure: Measure, *, mode: str, recipe: str, rounds: int = 3,
              min_gain: float = MIN_GAIN, progress: Progress | None = None) -> TrialResult:
    """Build every candidate (``measure``), time them in ``rounds`` interleaved rounds, judge."""
    report = progress or (lambda ev: None)
    t0 = time.perf_counter()
    report({"event": "fp8_trial", "phase": "start", "mode": mode,
            "candidates": [{"name": c.name, "converted": len(c.converted), "why": c.why} for c in cands]})
    timers: dict[str, Timer] = {}
    failed: dict[str, str] = {}
    for i, c in enumerate(cands):
        report({"event": "fp8_trial", "phase": "build", "candidate": c.name, "index": i, "total": len(cands)})
        try:
            timers[c.name] = measure(c)
        except Exception as exc:  # noqa: BLE001 - a layer set that cannot run is dropped, and said so
            if c.name == BF16:
                raise
            failed[c.name] = first_line(exc, 160)
    ms: dict[str, list[float]] = {c.name: [] for c in cands}
    for rnd in range(max(1, rounds)):
        for c in (cands if rnd % 2 == 0 else cands[::-1]):
            if c.name in failed:
                continue
            try:
                value = float(timers[c.name]())
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory in its first (compiling) steps
                if c.name == BF16:
                    raise
                failed[c.name] = first_line(exc, 160)
                continue
            ms[c.name].append(value)
            report({"event": "fp8_trial", "phase": "round", "candidate": c.name, "round": rnd, "ms": value})
    cands = [c for c in cands if c.name not in failed]
    rows = tuple(Measured(c.name, len(c.converted), tuple(ms[c.name])) for c in cands)
    winner, reason = judge(rows, min_gain=min_gain)
    converted = next(c.converted for c in cands if c.name == winner)
    result = TrialResult(mode=mode, recipe=recipe, rows=rows, winner=winner, converted=converted, reason=reason,
                         trial_s=time.perf_counter() - t0, tried=tuple(cands), failed=tuple(failed.items()))
    report({"event": "fp8_trial", "phase": "done", "summary": result.summary(), "result": result.to_dict()})
    return result


def to_report(model: nn.Module, result: TrialResult, *, filter: FP8Filter | None = None) -> FP8Report:
    """The :class:`~ampkit.engine.fp8.FP8Report` that converts the winner's layers, saying why each other stays."""
    eligible = plan(model, filter, recipe=result.recipe)
    chosen = set(result.converted)
    kept = list(eligible.kept) + [(n, f"BF16 in the fastest layer set measured ({result.winner})")
                                  for n in eligible.converted if n not in chosen]
    order = {n: i for i, n in enumerate(eligible.converted + tuple(n for n, _ in eligible.kept))}
    kept.sort(key=lambda nk: order.get(nk[0], 0))
    return FP8Report(result.recipe, tuple(n for n in eligible.converted if n in chosen), tuple(kept))
