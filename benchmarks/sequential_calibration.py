"""How often `ampkit compare --seeds auto` is wrong, and how many seeds it takes, on real runs and on simulated ones.

    PYTHONPATH=src python3 benchmarks/sequential_calibration.py              # digits + charlm: ~15 min, busy 2 cores
    PYTHONPATH=src python3 benchmarks/sequential_calibration.py --pool 12 --orders 100 --no-charlm   # quicker

Three parts, all written to benchmarks/results/cpu-sequential-calibration.json (date, machine, torch, commit):

1. **design**: the crossing rate of the sequential bounds themselves (ampkit.verify.sequential) at a harm equal to
   the tolerance, on sequences of normal harms independent of the ones the levels were bisected on: the false-PASS
   and false-FAIL rates of each endpoint's test, the worst case of every harm.
2. **simulated**: the whole judge (both endpoints, floors, counting) with `--seeds auto` on independent simulated
   seeds (tests/verify/test_judge.py's generator: the noise measured on real digits and charlm runs), for no harm,
   A/A (the AMP side replaced by another seed's FP32 run: no harm, no pairing) and a loss made worse by 1x, 1.5x and
   2x the 1 % tolerance; beside it the fixed-N judge at 3 and 5 seeds on the same kind of seeds.
3. **real**: a pool of seeds of a built-in task trained in FP32 and in BF16 CPU autocast (as `compare` trains
   them); `--seeds auto` is run over random orders of the pool. Conditions: none (AMP as it is), A/A, and the
   planted "bias" harm of tests/verify/planted_task.py (the loss, training and evaluated, times 1 + k x tolerance),
   applied to the recorded AMP runs: AdamW is invariant to the scale of the loss, so training with the bias gives
   the same weights and only the reported losses change. Orders of one pool share seeds: the real rates say how
   the verdict depends on which seeds were drawn; the independent calibration is part 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "verify")]

MAX = 12
SIZES = (1.0, 1.5, 2.0)  # planted loss harms, in units of the 1 % tolerance


def _auto(pairs: dict, order: list[int], *, lm: bool, count: int | None) -> tuple[str, int]:
    from ampkit.verify.judge import judge
    from ampkit.verify.sequential import Looks, run_until_decided

    looks = Looks(last=MAX)
    last = {"v": "inconclusive"}

    def decide(seeds):
        v = judge(label="BF16", fp32={k: pairs[k][0] for k in seeds}, amp={k: pairs[k][1] for k in seeds},
                  metric="val loss" if lm else "accuracy", higher_is_better=not lm, metric_count=count, looks=looks)
        last["v"] = v.verdict
        return v.verdict

    used, _ = run_until_decided(order, looks=looks, train=lambda k: [], decide=decide)
    return last["v"], len(used)


def _fixed(pairs: dict, seeds: list[int], *, lm: bool, count: int | None) -> str:
    from ampkit.verify.judge import judge

    return judge(label="BF16", fp32={k: pairs[k][0] for k in seeds}, amp={k: pairs[k][1] for k in seeds},
                 metric="val loss" if lm else "accuracy", higher_is_better=not lm, metric_count=count).verdict


def _summary(results: list[tuple[str, int]]) -> dict:
    n = len(results)
    verdicts = [v for v, _ in results]
    used = [k for _, k in results]
    return {"runs": n, **{f"{v}_rate": verdicts.count(v) / n for v in ("pass", "fail", "inconclusive")},
            "mean_seeds": statistics.fmean(used), "max_seeds_used": max(used)}


def design_part(reps: int) -> dict:
    from ampkit.verify.sequential import crossing_rate, nominal_alpha

    out = {}
    for alpha, what in ((0.05, "false PASS (and false FAIL with one endpoint)"), (0.025, "false FAIL per endpoint "
                                                                                      "of two (Bonferroni)")):
        level = nominal_alpha(alpha, 3, MAX)
        out[str(alpha)] = {"what": what, "nominal_level": level,
                           "crossing_rate": crossing_rate(level, 3, MAX, reps=reps, seed=12345)}
    return out


def simulated_part(reps: int) -> dict:
    import test_judge as sim

    out: dict = {}
    for shape in ("digits", "lm"):
        lm = shape == "lm"
        rng = random.Random(7 if lm else 3)
        got: dict = {}
        for _ in range(reps):
            raw = [sim._seed(rng, shape=shape) for _ in range(MAX + 1)]
            pairs = {k: raw[k] for k in range(MAX)}
            conds = _conditions(pairs, lm)
            conds["A/A"] = {k: (raw[k][0], raw[k + 1][0]) for k in range(MAX)}  # another seed's FP32 run
            for name, ps in conds.items():
                g = got.setdefault(name, {"auto": [], 3: [], 5: []})
                g["auto"].append(_auto(ps, list(range(MAX)), lm=lm, count=None if lm else sim.N_TEST))
                for n in (3, 5):
                    g[n].append((_fixed(ps, list(range(n)), lm=lm, count=None if lm else sim.N_TEST), n))
        for name, g in got.items():
            out[f"{shape}: {name}"] = {"auto": _summary(g["auto"]), "fixed_3": _summary(g[3]),
                                       "fixed_5": _summary(g[5])}
            print(shape, name, json.dumps(out[f"{shape}: {name}"]["auto"]), file=sys.stderr, flush=True)
    return out


def _planted(fp32, amp, k: float, loss_metric: bool):
    """The AMP run made worse by ``k`` tolerances in the judge's own units: each logged loss raised by
    ``k * TOLERANCE`` of the FP32 loss at that step (never of less than a tenth of its first loss, as the judge
    takes it), and a loss metric likewise: on charlm this is the planted "bias" harm (the loss times 1 + k %)."""
    from ampkit.verify.band import RunOutcome
    from ampkit.verify.judge import LOSS_SCALE_FLOOR, TOLERANCE

    ref = {int(s): v for s, v in fp32.curve}
    first = next((v for _, v in fp32.curve if v is not None), 0.0)

    def up(v, f):
        return None if v is None else v + k * TOLERANCE * max(abs(f), LOSS_SCALE_FLOOR * abs(first))

    curve = [[s, up(v, ref.get(int(s), v) or 0.0)] for s, v in amp.curve]
    final = up(amp.final, fp32.final) if loss_metric else amp.final
    return RunOutcome(curve=curve, final=final, steps=amp.steps, skipped=amp.skipped, warnings=amp.warnings)


def _conditions(pairs: dict, lm: bool) -> dict:
    seeds = sorted(pairs)
    conds = {"none": pairs, "A/A": {s: (pairs[s][0], pairs[seeds[(i + 1) % len(seeds)]][0])
                                    for i, s in enumerate(seeds)}}
    for k in SIZES:
        conds[f"loss {k}x tolerance"] = {s: (f, _planted(f, a, k, lm)) for s, (f, a) in pairs.items()}
    return conds


def real_part(base: str, pool: int, orders: int, steps: int | None, options: dict) -> dict:
    from verdict_calibration import _plan

    from ampkit.verify.runs import outcome

    seeds = list(range(pool))
    plan = _plan(base, "none", seeds, steps, options)
    t0 = time.process_time()
    runs = {s: (plan.run(s, plan.fp32)[1], plan.run(s, plan.amp)[1]) for s in seeds}
    metric = runs[0][0].metric
    lm = "loss" in metric
    count = (plan.first_task.extra or {}).get("n_test") if not lm else None
    pairs = {s: (outcome(f), outcome(a)) for s, (f, a) in runs.items()}
    conds = _conditions(pairs, lm)
    rng = random.Random(0)
    order_list = [rng.sample(seeds, pool) for _ in range(orders)]
    out = {"steps": plan.steps, "pool": pool, "orders": orders, "metric": metric,
           "cpu_s_per_run": (time.process_time() - t0) / (2 * pool), "conditions": {}}
    for name, ps in conds.items():
        auto = [_auto(ps, order, lm=lm, count=count) for order in order_list]
        fixed = {n: [(_fixed(ps, order[:n], lm=lm, count=count), n) for order in order_list] for n in (3, 5)}
        out["conditions"][name] = {"auto": _summary(auto), **{f"fixed_{n}": _summary(r) for n, r in fixed.items()}}
        print(base, name, json.dumps(out["conditions"][name]["auto"]), file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--orders", type=int, default=200)
    ap.add_argument("--sim-reps", type=int, default=400)
    ap.add_argument("--no-charlm", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu-sequential-calibration.json"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    record = {"kind": "sequential-verdict-calibration", "git_commit": commit.strip(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()} {os.cpu_count()} cores (shared)", "torch": torch.__version__,
              "precision": "bf16 (CPU autocast)", "max_seeds": MAX, "tolerance": 0.01, "alpha": 0.05}
    t0 = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        record["wall_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    record["design"] = design_part(200_000)
    record["simulated"] = simulated_part(args.sim_reps)
    save()
    record["real"] = {"digits": real_part("digits", args.pool, args.orders, None, {})}
    save()
    if not args.no_charlm:
        record["real"]["charlm"] = real_part("charlm", args.pool, args.orders, 200, {"d_model": 32, "n_layers": 1})
        save()
    print(f"wrote {out} in {record['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
