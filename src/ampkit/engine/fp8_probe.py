"""The FP8 cost probe: time a linear layer in BF16 and as torchao's ``Float8Linear`` on this card, at first use.

:func:`cost_model` returns the cached :class:`~ampkit.engine.fp8_cost.CostModel` for this card, torch and
torchao version, recipe and mode, or probes and caches one. The probe times forward + backward of one
layer (weights in FP32 as in training, BF16 autocast) at :data:`PROBE_SHAPES`: about 5 s eager and
30-60 s compiled on an H200 (each shape is compiled once, for BF16 and for FP8).
"""

from __future__ import annotations

import copy
import time
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from ampkit.compat import recompile_limit, require_torchao, torchao_missing
from ampkit.device import Device
from ampkit.device.provenance import git_commit
from ampkit.device.timer import Timer
from ampkit.engine.fp8_cost import CostModel, Timing, cache_key, cache_path, load_cached, save_cached
from ampkit.errors import first_line

__all__ = ["PROBE_SHAPES", "probe_timings", "cost_model", "device_key"]

# (M tokens, K in, N out): GPT-2-small's to 8B-class layers, sizes 2^29 .. 2^40.
PROBE_SHAPES = ((2048, 512, 512), (8192, 768, 768), (8192, 768, 3072), (8192, 2048, 2048),
                (16384, 2048, 8192), (16384, 4096, 16384))


def _torchao_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def device_key(device: Device, recipe: str, mode: str) -> dict[str, Any]:
    return cache_key(card=device.name, capability=device.capability, torch=torch.__version__,
                     torchao=_torchao_version(), recipe=recipe, mode=mode)


def _time(fn: Any, device: Device, *, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    timer = Timer(device).start()
    for _ in range(iters):
        fn()
    return timer.stop().elapsed() * 1e3 / iters


def probe_timings(device: Device, recipe: str, mode: str, shapes: tuple[tuple[int, int, int], ...] = PROBE_SHAPES,
                  *, warmup: int = 3, iters: int = 10) -> list[Timing]:
    """BF16 and FP8 milliseconds of one linear layer's forward + backward at each shape (needs the card)."""
    float8 = require_torchao()
    with recompile_limit(8 + 2 * len(shapes)):  # one compile per shape and layer kind: never an eager fallback
        return _probe(float8, device, recipe, mode, shapes, warmup=warmup, iters=iters)


def _probe(float8: Any, device: Device, recipe: str, mode: str, shapes: tuple[tuple[int, int, int], ...], *,
           warmup: int, iters: int) -> list[Timing]:
    dev = device.torch_device
    out = []
    for m, k, n in shapes:
        torch.manual_seed(0)
        bf16 = nn.Linear(k, n, bias=False).to(dev)
        fp8 = float8.convert_to_float8_training(nn.Sequential(copy.deepcopy(bf16)),
                                                config=float8.Float8LinearConfig.from_recipe_name(recipe))
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        times = []
        for layer in (bf16, fp8):
            run = torch.compile(layer, dynamic=False) if mode == "compiled" else layer

            def step(run: Any = run, x: torch.Tensor = x, dy: torch.Tensor = dy) -> None:
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    y = run(x)
                y.backward(dy)

            times.append(_time(step, device, warmup=warmup, iters=iters))
        out.append(Timing(m, k, n, times[0], times[1]))
        del bf16, fp8, x, dy
        device.empty_cache()
    return out


def cost_model(device: Device, recipe: str, mode: str, *, probe: bool = True) -> tuple[CostModel | None, str]:
    """The cost model for ``device`` (cached, else probed and cached when ``probe``), and how it was found:
    ``"cached in PATH"``, ``"probed in 12 s, cached in PATH"``, or why there is none."""
    key = device_key(device, recipe, mode)
    path = cache_path()
    cached = load_cached(key, path)
    if cached is not None:
        return cached, f"cached in {path}"
    if not probe:
        return None, f"no cached FP8 cost model for {device.name} ({mode}) in {path} and the probe is off"
    if not device.is_accelerator:
        return None, f"no cached FP8 cost model for {device.name} and the probe runs on accelerators only"
    missing = torchao_missing()
    if missing:
        return None, missing
    t0 = time.perf_counter()
    try:
        timings = probe_timings(device, recipe, mode)
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run is a finding, not a crash
        return None, f"the FP8 cost probe failed here: {first_line(exc, 200)}"
    seconds = time.perf_counter() - t0
    model = CostModel(key=key, timings=tuple(timings), provenance={
        "source": "probe", "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ampkit_commit": git_commit(), "probe_s": round(seconds, 1)})
    try:
        save_cached(model, path)
        where = f"cached in {path}"
    except OSError as exc:
        where = f"not cached ({first_line(exc, 120)}): set AMPKIT_FP8_COST_CACHE to a writable file"
    return model, f"probed in {seconds:.0f} s, {where}"
