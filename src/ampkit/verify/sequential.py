"""``compare --seeds auto``: seed pairs added until the paired verdict is decided (a group-sequential test).

The fixed-N verdict (:mod:`ampkit.verify.judge`) looks once, at N seeds, with one-sided Student-t bounds at
``ALPHA`` = 5 %. Looking after every pair from the third to the ``max_seeds``-th and stopping at the first
decided look would spend that 5 % again at every look. Here each look uses a smaller **nominal level**, the same
at every look (Pocock's design: the spending is front-loaded, so a clear verdict stops early), chosen so that the
chance of *ever* crossing a bound over all looks is the overall level:

* the false-PASS rate: a harm exactly at the tolerance whose upper bound falls below it at some look;
* the false-FAIL rate: a harm at the tolerance whose lower bound rises above it at some look (per endpoint at
  ``ALPHA / m``, Bonferroni over the ``m`` endpoints, as the fixed-N judge).

At a harm equal to the tolerance the statistic ``sqrt(n) (mean - tol) / sd`` of look n does not depend on the
spread of the harms, so the crossing chance depends only on the nominal level and the looks: it is measured
once per design by :data:`REPS` simulated paired sequences of standard normal harms (a fixed generator seed:
the same levels on every machine) and the level is bisected to ``alpha`` minus two Monte-Carlo standard errors
(on the safe side). A stopped comparison only removes later looks, so pass and fail bounds, each with its own
level, keep their rates when both are used. The floor on the spread (a counting error, a loss resolution) only
widens the bounds.

>>> round(nominal_alpha(0.05, 3, 12), 4)   # each of the 10 looks at 1.18 % instead of 5 %
0.0118
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from ampkit.verify.stats import ALPHA, t_quantile

__all__ = ["FIRST_LOOK", "MAX_SEEDS", "REPS", "Looks", "nominal_alpha", "crossing_rate", "run_until_decided",
           "auto_looks", "stopped", "run_auto"]

FIRST_LOOK = 3  # the first look: two seeds give a single degree of freedom, too wide to decide anything
MAX_SEEDS = 12  # the default --max-seeds
REPS = 200_000  # simulated sequences per design (standard error of a 5 % rate: 0.05 %)


def _t_stats(first: int, last: int, reps: int, seed: int = 0):
    """``reps x looks`` matrix of ``sqrt(n) * mean / sd`` of standard normal draws after n = first..last draws."""
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((reps, last))
    n = np.arange(1, last + 1, dtype=np.float64)
    s1, s2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    mean = s1 / n
    var = (s2 - n * mean * mean) / np.maximum(n - 1, 1)
    t = np.sqrt(n) * mean / np.sqrt(np.maximum(var, 1e-300))
    return t[:, first - 1:last]


def crossing_rate(level: float, first: int, last: int, reps: int = REPS, seed: int = 0) -> float:
    """The chance that ``mean + t(1 - level, n - 1) sd / sqrt(n)`` falls below the true mean at any look n (by
    symmetry, that the lower bound rises above it): the overall error of the design at this nominal level."""
    import numpy as np

    t = _t_stats(first, last, reps, seed)
    q = np.array([t_quantile(1.0 - level, n - 1) for n in range(first, last + 1)])
    return float(np.mean(np.any(t < -q, axis=1)))


@functools.lru_cache(maxsize=64)
def nominal_alpha(alpha: float, first: int, last: int) -> float:
    """The nominal one-sided level of each look n = first..last that keeps the overall level at ``alpha``."""
    import numpy as np

    if last <= first:
        return alpha
    t = _t_stats(first, last, REPS)
    target = alpha - 2.0 * math.sqrt(alpha * (1.0 - alpha) / REPS)

    def rate(level: float) -> float:
        q = np.array([t_quantile(1.0 - level, n - 1) for n in range(first, last + 1)])
        return float(np.mean(np.any(t < -q, axis=1)))

    lo, hi = alpha / (last - first + 1), alpha  # Bonferroni is safe; alpha at every look is not
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        if rate(mid) <= target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-4:
            break
    return lo


@dataclass(frozen=True, kw_only=True)
class Looks:
    """The sequential design of one comparison: looks after seed ``first`` .. ``last`` at overall ``ALPHA``."""

    first: int = FIRST_LOOK
    last: int = MAX_SEEDS

    def level(self, alpha: float = ALPHA) -> float:
        """The nominal level of one look for an overall ``alpha``."""
        return nominal_alpha(alpha, self.first, self.last)

    def to_dict(self) -> dict[str, Any]:
        return {"method": "group-sequential (Pocock: one nominal level per look, simulated)", "first_look": self.first,
                "max_seeds": self.last, "alpha": ALPHA, "nominal_pass": self.level(ALPHA),
                "nominal_fail": {str(m): self.level(ALPHA / m) for m in (1, 2)}}


def run_until_decided(seeds: list[int], *, looks: Looks, train: Callable[[int], list[str]],
                      decide: Callable[[list[int]], str]) -> tuple[list[int], str]:
    """Train seed pairs in order (``train(seed)``: the hard reasons that one pair fails on its own) and judge
    after each from ``looks.first`` on (``decide(seeds so far)``: the verdict); return (seeds used, why it
    stopped). A hard reason (non-finite loss, skipped steps, scale collapse) stops at once: no statistics
    excuse it."""
    done: list[int] = []
    for seed in seeds[:looks.last]:
        done.append(seed)
        hard = train(seed)
        if hard:
            return done, f"failed a rule at seed {seed} that no statistics excuse: {hard[0]}"
        if len(done) >= looks.first:
            verdict = decide(done)
            if verdict != "inconclusive":
                return done, f"decided ({verdict}) after {len(done)} seeds"
    return done, f"undecided after --max-seeds {looks.last} seeds"


def auto_looks(seeds: Any, max_seeds: int = MAX_SEEDS, resume: bool = False) -> Looks | None:
    """The design of ``seeds="auto"`` (None for a fixed number or list of seeds), or the one-line UsageError."""
    from ampkit.errors import UsageError

    if not isinstance(seeds, str):
        return None
    if seeds != "auto":
        raise UsageError(f"--seeds takes a number or 'auto', got {seeds!r}")
    if isinstance(max_seeds, bool) or not isinstance(max_seeds, int) or max_seeds < FIRST_LOOK:
        raise UsageError(f"--max-seeds must be an integer >= {FIRST_LOOK} (the first look), got {max_seeds!r}")
    if resume:
        raise UsageError("--continue adds seeds up to a fixed count: give --seeds N (more than the folder holds)")
    return Looks(last=max_seeds)


def stopped(verdict: Any, used: int, why: str) -> Any:
    """The verdict of the last look with the seeds used and why adding them stopped (``effects["sequential"]``)."""
    seq = {**verdict.effects.get("sequential", {}), "seeds_used": used, "stopped": why}
    return replace(verdict, effects={**verdict.effects, "sequential": seq},
                   notes=(*verdict.notes, f"--seeds auto: {used} seeds; {why}"))


def run_auto(todo: Any, looks: Looks, *, run_all: Callable[[Any, int, int], dict[str, dict[int, Any]]],
             decide: Callable[[Any, dict[str, dict[int, Any]]], str]) -> tuple[dict[str, dict[int, Any]], str]:
    """``compare --seeds auto`` on a task: one seed pair at a time. ``todo`` is the comparison's
    :class:`~ampkit.verify.runs.RunPlan` over every seed it may use, ``run_all(plan, first_run, total_runs)``
    trains a plan's seeds in both precisions, ``decide(plan, runs)`` judges (at this look's levels). Returns
    (the runs of the seeds used, why it stopped)."""
    from ampkit.verify.band import seed_reasons
    from ampkit.verify.runs import outcome

    new: dict[str, dict[int, Any]] = {"fp32": {}, "amp": {}}

    def train(seed: int) -> list[str]:
        sub = replace(todo, seeds=(seed,), first_task=todo.first_task if seed == todo.seeds[0] else None)
        got = run_all(sub, 2 * len(new["fp32"]) + 1, 2 * looks.last)
        todo.graph = sub.graph  # graphs off for the rest when one precision could not be captured
        for side in new:
            new[side].update(got[side])
        return seed_reasons(seed, outcome(got["amp"][seed]), todo.amp.name.upper())

    def judge_now(seeds: list[int]) -> str:
        return decide(replace(todo, seeds=tuple(seeds)), {side: {s: new[side][s] for s in seeds} for side in new})

    used, why = run_until_decided(list(todo.seeds), looks=looks, train=train, decide=judge_now)
    return {side: {s: new[side][s] for s in used} for side in new}, why
