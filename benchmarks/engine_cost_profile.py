"""What the engine adds to a step, counted with the profiler rather than timed: kernels launched and device
time per step, the hand-written torch.amp loop against ampkit's engine, on the same model and batches.

    OUT=/tmp/out PYTHONPATH=src python3 benchmarks/engine_cost_profile.py resnet50 [hf-gpt2 ...]

Wall-clock timing of a 30 ms step cannot resolve a 0.1 % difference when rounds spread by 5 % (ResNet-50 on
an H200 does); the profiler's device-side kernel times can. Writes $OUT/engine-cost-<model>.json.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from ampkit.bench.core import BenchConfig, _precisions
from ampkit.bench.runners import Ctx, build
from ampkit.bench.workloads import load_workload
from ampkit.device import detect_device
from ampkit.device.provenance import git_commit

STEPS = 10


def _kernels(prof) -> tuple[int, float, Counter]:
    """Kernels launched and their device time (us), from the profiler's device events."""
    names: Counter = Counter()
    total = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] += 1
            total += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return sum(names.values()), total, names


def measure(model_name: str) -> dict:
    device = detect_device()
    wl = load_workload(model_name, device)
    out = {"model": model_name, "description": wl.description, "card": device.name, "torch": torch.__version__,
           "git_commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "steps_profiled": STEPS, "precisions": {}}
    for label, prec in _precisions(BenchConfig(precisions=("bf16", "fp16")), device, []):
        per: dict[str, dict] = {}
        for runner in ("plain", "ampkit"):
            wl.reset()
            ctx = Ctx(model=wl.model, loss=wl.loss, forward=lambda b, w=wl: w.loss(w.model, b),
                      example_batch=wl.batches[0], precision=prec, device=device, optimizer=wl.optimizer,
                      max_grad_norm=1.0, compiled=False)
            built = build(runner, ctx)
            for i in range(5):
                built.step(wl.batches[i % len(wl.batches)])
            device.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(STEPS):
                    built.step(wl.batches[i % len(wl.batches)])
                device.synchronize()
            n, us, names = _kernels(prof)
            per[runner] = {"kernels_per_step": n / STEPS, "device_us_per_step": us / STEPS, "names": names}
        extra = per["ampkit"]["names"] - per["plain"]["names"]
        fewer = per["plain"]["names"] - per["ampkit"]["names"]
        out["precisions"][label] = {
            "plain": {k: v for k, v in per["plain"].items() if k != "names"},
            "ampkit": {k: v for k, v in per["ampkit"].items() if k != "names"},
            "extra_kernels_per_step": {k: v / STEPS for k, v in extra.most_common(20)},
            "fewer_kernels_per_step": {k: v / STEPS for k, v in fewer.most_common(20)},
            "device_time_ratio": (per["ampkit"]["device_us_per_step"] / per["plain"]["device_us_per_step"]
                                  if per["plain"]["device_us_per_step"] else None),
        }
    return out


def main(argv: list[str]) -> int:
    folder = os.environ.get("OUT", ".")
    for name in argv or ["resnet50"]:
        result = measure(name)
        with open(os.path.join(folder, f"engine-cost-{name}.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
        for label, r in result["precisions"].items():
            print(f"{name} {label}: kernels/step plain {r['plain']['kernels_per_step']:.0f} ampkit "
                  f"{r['ampkit']['kernels_per_step']:.0f}; device us/step plain {r['plain']['device_us_per_step']:.0f} "
                  f"ampkit {r['ampkit']['device_us_per_step']:.0f} (x{r['device_time_ratio'] or float('nan'):.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
