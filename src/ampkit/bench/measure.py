"""Measurements: the device's matmul rate, step timing with device events, host syncs per step."""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch

from ampkit.device import Device
from ampkit.errors import DeviceError

__all__ = ["matmul_rate", "time_steps", "count_syncs", "strict_sync_check"]


def matmul_rate(device: Device) -> dict[str, Any]:
    """The device's dense matmul rate measured now: an 8192^3 BF16 product on accelerators (FP16 where
    BF16 is missing), a 1024^3 FP32 product on the CPU. This is the MFU denominator."""
    if device.is_accelerator:
        n, reps, warm = 8192, 10, 3
        dtype = torch.float16 if device.strict_bf16_supported() is False else torch.bfloat16
    else:
        n, reps, warm = 1024, 5, 1
        dtype = torch.float32
    dev = device.torch_device
    a = torch.randn(n, n, device=dev, dtype=dtype)  # random data: zeros run faster on some cards
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(warm):
        torch.mm(a, b)
    timer = device.timer().start()
    for _ in range(reps):
        torch.mm(a, b)
    secs = timer.stop().elapsed()
    del a, b
    device.empty_cache()
    rate = 2.0 * n**3 * reps / secs
    return {"flops_per_s": rate, "tflops": rate / 1e12, "dtype": str(dtype).replace("torch.", ""),
            "shape": [n, n, n], "reps": reps}


def time_steps(step: Callable[[Any], torch.Tensor], batches: list[Any], device: Device, *, warmup: int,
               steps: int) -> dict[str, Any]:
    """Run ``warmup`` steps, then time ``steps`` steps between two device events (a clock on the CPU).

    Events bracket the whole timed loop, so host time the device waits for (launches, syncs) counts:
    the figure is what a training run sees. Returns seconds per step, warm-up wall seconds (compile
    time shows here) and the last loss as a device tensor.
    """
    k = len(batches)
    t0 = time.perf_counter()
    last = None
    for i in range(warmup):
        last = step(batches[i % k])
    device.synchronize()
    warmup_s = time.perf_counter() - t0
    timer = device.timer().start()
    for i in range(steps):
        last = step(batches[(warmup + i) % k])
    secs = timer.stop().elapsed()
    return {"s_per_step": secs / steps, "warmup_s": warmup_s, "last_loss": last}


def _sync_mode(device: Device) -> int | None:
    try:
        return device.get_sync_debug_mode()
    except Exception:  # noqa: BLE001
        return None


def count_syncs(step: Callable[[Any], torch.Tensor], batches: list[Any], device: Device, *, n: int = 3,
                offset: int = 0) -> float | None:
    """Host-device synchronisations per step, counted by the device's sync debug mode "warn" over
    ``n`` steady-state steps. None where the backend has no sync debug mode (the CPU)."""
    previous = _sync_mode(device)
    if previous is None:
        return None
    k = len(batches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            device.set_sync_debug_mode("warn")
        except DeviceError:
            return None
        try:
            for i in range(n):
                step(batches[(offset + i) % k])
        finally:
            device.set_sync_debug_mode(previous)
    # Only the per-call message: torch also warns once that the debug mode "is a prototype feature",
    # which is no sync.
    hits = [w for w in caught if "called a synchronizing" in str(w.message).lower()]
    return len(hits) / n


def strict_sync_check(step: Callable[[Any], torch.Tensor], batches: list[Any], device: Device, *, n: int = 3,
                      offset: int = 0) -> str | None:
    """Run ``n`` steps under sync debug mode "error": None when none raised, else the error's first line.
    Returns "n/a" where the backend has no sync debug mode."""
    previous = _sync_mode(device)
    if previous is None:
        return "n/a"
    k = len(batches)
    try:
        device.set_sync_debug_mode("error")
        for i in range(n):
            step(batches[(offset + i) % k])
    except RuntimeError as exc:
        return (str(exc).strip().splitlines() or ["RuntimeError"])[0]
    finally:
        device.set_sync_debug_mode(previous)
    device.synchronize()  # outside "error" mode: synchronize() itself is a sync
    return None
