"""Speed and memory of ``compare SCRIPT``: the steady-state optimizer step and the peak device memory.

Each run times its own steps in the script's process (:mod:`ampkit.diagnose.step_timer`: device events, read
once at the end; the first steps, and intervals far above the median such as an evaluation, left out). Seed k's
AMP run is paired with seed k's FP32 run, so the speed-up comes with its spread over seeds
(:func:`ampkit.training.speed.speed_ratio`). A run too short for a steady state falls back to steps per second
of the whole process, and says so. Never part of the verdict.

>>> from types import SimpleNamespace as R
>>> runs = {"fp32": {0: R(step_ms=[50.0] * 3 + [20.0] * 10, peak_bytes=None, steps=14, wall_s=1.0)},
...         "amp": {0: R(step_ms=[50.0] * 3 + [10.0] * 10, peak_bytes=None, steps=14, wall_s=1.0)}}
>>> step_speed(runs, "BF16")["note"]
'steady-state step: 20 ms FP32 vs 10 ms BF16, speed-up 2.00x (one seed: no spread measured)'
"""

from __future__ import annotations

import statistics
from typing import Any

from ampkit.diagnose.step_timer import steady_ms
from ampkit.training.speed import speed_ratio

__all__ = ["step_speed"]


def _ms(v: float) -> str:
    return f"{v:.3g}"


def step_speed(runs: dict[str, dict[int, Any]], label: str) -> dict[str, Any]:
    """``{"throughput", "memory", "ratios", "note"}`` of a script comparison's runs (a ``ScriptRun`` per side and
    seed)."""
    steady = {side: {s: steady_ms(r.step_ms) for s, r in rs.items()} for side, rs in runs.items()}
    peaks = {side: [r.peak_bytes for r in rs.values()] for side, rs in runs.items()}
    peak = {side: (max(v) if v and all(x is not None for x in v) else None) for side, v in peaks.items()}
    memory = {"fp32": peak["fp32"], "amp": peak["amp"], "unit": "bytes"}
    saving = 1.0 - peak["amp"] / peak["fp32"] if peak["amp"] and peak["fp32"] else None
    seeds = [s for s in runs["fp32"] if s in runs["amp"]]
    if seeds and all(steady[side][s] for side in steady for s in seeds):
        ms = {side: statistics.median(steady[side][s] for s in seeds) for side in steady}
        ratio = speed_ratio([1.0 / steady["amp"][s] for s in seeds], [1.0 / steady["fp32"][s] for s in seeds])
        spread = ratio.spread
        rng = (f"range {spread[0]:.2f}x-{spread[1]:.2f}x over {len(seeds)} seeds" if spread else
               "one seed: no spread measured")
        note = (f"steady-state step: {_ms(ms['fp32'])} ms FP32 vs {_ms(ms['amp'])} ms {label}, speed-up "
                f"{ratio.median:.2f}x ({rng})")
        throughput = {"fp32": 1e3 / ms["fp32"], "amp": 1e3 / ms["amp"], "unit": "steps/s (steady state)",
                      "step_ms": ms, "per_seed": {side: {s: steady[side][s] for s in seeds} for side in steady},
                      "per_seed_unit": "ms per step (steady state)"}
        ratios = {"speedup": ratio.median, "speedup_spread": ratio.to_dict(), "memory_saving": saving}
        return {"throughput": throughput, "memory": memory, "ratios": ratios, "note": note}
    sps = {side: statistics.median([r.steps / r.wall_s for r in rs.values()]) for side, rs in runs.items()}
    note = ("speed: too few optimizer steps for a steady state, so steps per second of each whole run (process "
            "start, set-up and evaluation included)")
    throughput = {"fp32": sps["fp32"], "amp": sps["amp"], "unit": "steps/s (whole process)",
                  "per_seed": {side: {s: r.steps / r.wall_s for s, r in rs.items()} for side, rs in runs.items()}}
    ratios = {"speedup": sps["amp"] / sps["fp32"] if sps["fp32"] else None, "memory_saving": saving}
    return {"throughput": throughput, "memory": memory, "ratios": ratios, "note": note}
