"""How often the paired verdict of `ampkit compare` is wrong, measured on real FP32 and AMP training runs.

    PYTHONPATH=src python3 benchmarks/verdict_calibration.py                 # digits: ~10 min on a busy 2-core CPU
    PYTHONPATH=src python3 benchmarks/verdict_calibration.py --pool 6 --charlm  # and the 5 %-worse LM loss on charlm

For a pool of seeds, each seed is trained once in FP32 and once per planted harm in BF16 autocast
(tests/verify/planted_task.py: the harm applies only while autocast is on; "none" is AMP as it is),
exactly as `ampkit compare` trains them (same initial weights, same batches). Then every subset of n
seeds of the pool is judged with the judge `compare` uses (`ampkit.verify.compare.judge_runs`), and
the share of pass / fail / inconclusive verdicts is counted per harm and n. Also "relabelled": each
seed's AMP side replaced by the FP32 run of the next seed of the pool (no harm, no pairing).

Subsets share seeds, so the rates are not from independent replicates: they say how the verdict of
this pool's seeds depends on which n were drawn (the statistical calibration over independent
simulated replicates is tests/verify/test_judge.py). Writes benchmarks/results/cpu-verdict-calibration.json
with the date, machine, torch and git commit.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = str(ROOT / "tests" / "verify" / "planted_task.py") + ":make_task"
HARMS = ("none", "lr", "round", "labels", "bias")


def _plan(base: str, harm: str, seeds: list[int], steps: int | None, options: dict):
    from ampkit.device import detect_device
    from ampkit.device.policy import resolve_precision
    from ampkit.tasks import load_task
    from ampkit.verify.runs import RunPlan

    dev = detect_device("cpu")
    opts = {"base": base, "harm": harm, **options}
    make = lambda seed: load_task(PLANTED, seed=seed, options=opts, device=dev.torch_device)  # noqa: E731
    first = make(seeds[0])
    total = steps or first.default_steps
    return RunPlan(make=make, seeds=tuple(seeds), steps=total, log_every=max(1, total // 40), lr=None,
                   fp32=resolve_precision("fp32", dev), amp=resolve_precision("bf16", dev), first_task=first,
                   graph=False)


def _rates(plan, fp32: dict, amp: dict, sizes: list[int]) -> dict:
    from ampkit.verify.compare import judge_runs

    out = {}
    for n in sizes:
        counts = {"pass": 0, "fail": 0, "inconclusive": 0}
        for sub in itertools.combinations(sorted(fp32), n):
            v = judge_runs(plan, {"fp32": {s: fp32[s] for s in sub}, "amp": {s: amp[s] for s in sub}})
            counts[v.verdict] += 1
        total = sum(counts.values())
        out[str(n)] = {**counts, "subsets": total, **{f"{k}_rate": c / total for k, c in counts.items()}}
    return out


def _effect(plan, fp32: dict, amp: dict) -> list[dict]:
    from ampkit.verify.compare import judge_runs

    v = judge_runs(plan, {"fp32": fp32, "amp": amp})
    return [{k: e[k] for k in ("name", "mean", "sd", "lower", "upper", "tolerance", "decision")}
            for e in v.effects.get("endpoints", [])]


def run_base(base: str, harms: tuple[str, ...], pool: int, steps: int | None, options: dict) -> dict:
    seeds = list(range(pool))
    sizes = [n for n in (2, 3, 5, 8, 10) if n <= pool]
    plan = _plan(base, "none", seeds, steps, options)
    t0 = time.process_time()
    fp32 = {s: plan.run(s, plan.fp32)[1] for s in seeds}
    result = {"steps": plan.steps, "pool": seeds, "fp32_cpu_s_per_run": (time.process_time() - t0) / pool, "harms": {}}
    for harm in harms:
        hp = _plan(base, harm, seeds, steps, options)
        hp.inits = plan.inits  # the same initial weights as the FP32 runs
        amp = {s: hp.run(s, hp.amp)[1] for s in seeds}
        result["harms"][harm] = {"rates": _rates(plan, fp32, amp, sizes), "all_seeds": _effect(plan, fp32, amp),
                                 "final": {"fp32": [fp32[s].final for s in seeds], "amp": [amp[s].final for s in seeds]}}
        print(base, harm, json.dumps({n: r["fail_rate"] for n, r in result["harms"][harm]["rates"].items()}),
              file=sys.stderr, flush=True)
    relabel = {s: fp32[seeds[(i + 1) % pool]] for i, s in enumerate(seeds)}
    result["harms"]["relabelled"] = {"rates": _rates(plan, fp32, relabel, sizes),
                                     "all_seeds": _effect(plan, fp32, relabel)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--charlm", action="store_true", help="also charlm (small) with no harm and a 5 %%-worse loss")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu-verdict-calibration.json"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    record = {"kind": "verdict-calibration", "git_commit": commit.strip(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores (shared)".strip(),
              "torch": torch.__version__, "commit": commit.strip(), "precision": "bf16 (CPU autocast)",
              "threads": 1, "tasks": {}}
    t0 = time.perf_counter()
    jobs = [("digits", HARMS, args.steps, {})]
    if args.charlm:
        jobs.append(("charlm", ("none", "bias"), args.steps or 200, {"d_model": 32, "n_layers": 1}))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for base, harms, steps, options in jobs:  # written after each task: a long run keeps what it measured
        record["tasks"][base] = run_base(base, harms, args.pool, steps, options)
        record["wall_s"] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out} ({base}) at {record['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
