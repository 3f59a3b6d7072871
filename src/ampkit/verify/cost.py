"""What an FP32 region costs: step time and peak memory of the AMP forward + backward with and without it.

Measured on the task's first batch, the variants interleaved over a few rounds and the median kept,
so that a slow moment of the machine does not land on one variant. With one region the cost is
"all regions" minus "no region"; with several, each region's cost is "all regions" minus "all but
this one" (what dropping it would save).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ampkit.device.policy import Precision
from ampkit.tasks import Task

__all__ = ["step_cost", "region_costs"]


def step_cost(task: Task, precision: Precision, fp32_modules: tuple[str, ...] = (), *, steps: int = 4,
              warmup: int = 1) -> dict[str, Any]:
    """Seconds per forward + backward of ``task.batch(0)`` under ``precision``, and the peak memory (None on the CPU)."""
    from ampkit.engine.regions import apply_fp32_regions
    from ampkit.training.trainer import batch_to

    dev = precision.device
    model = task.model.to(dev.torch_device)
    batch = batch_to(task.batch(0), dev)
    handle = apply_fp32_regions(model, list(fp32_modules), device_type=dev.type) if fp32_modules else None
    model.train()
    try:
        for i in range(warmup + steps):
            if i == warmup:
                dev.synchronize()
                dev.reset_peak_memory_stats()
                t0 = time.perf_counter()
            with precision.autocast():
                loss = task.loss(model, batch)
            loss.float().backward()
            model.zero_grad(set_to_none=True)
        dev.synchronize()
        return {"step_s": (time.perf_counter() - t0) / steps, "peak_mem_bytes": dev.max_memory_allocated()}
    finally:
        if handle is not None:
            handle.remove()


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    mem = None if a["peak_mem_bytes"] is None or b["peak_mem_bytes"] is None else a["peak_mem_bytes"] - b["peak_mem_bytes"]
    return {"step_s_added": a["step_s"] - b["step_s"], "slowdown": a["step_s"] / b["step_s"] if b["step_s"] else None,
            "memory_added_bytes": mem}


def region_costs(task: Task, precision: Precision, fp32_modules: tuple[str, ...], *, rounds: int = 3
                 ) -> dict[str, Any]:
    """``{"baseline", "with_regions", "per_region": [{spec, names, step_s_added, slowdown, memory_added_bytes}]}``."""
    from ampkit.engine.regions import apply_fp32_regions

    specs = tuple(fp32_modules)
    variants: dict[str, tuple[str, ...]] = {"none": (), "all": specs}
    if len(specs) > 1:
        variants.update({f"without:{s}": tuple(x for x in specs if x != s) for s in specs})
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    for _ in range(rounds):
        for key, subset in variants.items():
            samples[key].append(step_cost(task, precision, subset))

    def med(key: str) -> dict[str, Any]:
        runs = samples[key]
        mems = [r["peak_mem_bytes"] for r in runs]
        return {"step_s": statistics.median(r["step_s"] for r in runs),
                "peak_mem_bytes": None if any(m is None for m in mems) else max(mems)}

    base, full = med("none"), med("all")
    per_region = []
    for spec in specs:
        handle = apply_fp32_regions(task.model, [spec], device_type=precision.device.type)
        handle.remove()
        ref = med(f"without:{spec}") if len(specs) > 1 else base
        per_region.append({"spec": spec, "names": list(handle.names), **_delta(full, ref)})
    return {"baseline": base, "with_regions": full, "per_region": per_region, **_delta(full, base),
            "method": f"forward + backward of the first batch, median of {rounds} interleaved rounds"}
