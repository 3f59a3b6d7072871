"""What :meth:`MixedPrecision.state_dict` saves and :meth:`~MixedPrecision.load_state_dict` restores.

Plain data only (loads with ``weights_only=True``): precision, scaler state, step and micro-step counts,
the open accumulation window, the device counters, the engine's settings and its FP32 regions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampkit.engine.counters import DeviceCounters

if TYPE_CHECKING:
    from ampkit.engine.core import MixedPrecision

__all__ = ["engine_state", "load_engine_state"]


def engine_state(amp: "MixedPrecision") -> dict[str, Any]:
    """The engine's resumable state; applies a pending scale update and syncs device-driven schedulers first."""
    amp.update()
    amp.sync_schedulers()
    return {
        "precision": amp.precision.name,
        "scaler": amp.scaler.state_dict() if amp.scaler is not None else None,
        "steps": amp.steps,
        "micro": amp._micro,
        "window": amp.accumulation_pending,
        # [skipped, consecutive, max_consecutive] as int64, the format since ampkit 0.1
        "counters": None if amp._counters is None else amp._counters.to_saved(),
        "config": amp.config.to_dict(),
        # the modules kept in FP32 (as matched by attach(); the specs when not attached)
        "fp32_modules": amp.config.to_dict()["fp32_modules"],  # the specs; attach() matched `names`
        # weights="bf16": the 16-bit remainders that, with the model's BF16 weights, are the exact FP32 values
        "remainders": amp.master.state_dict() if amp.master is not None else None,
    }


def load_engine_state(amp: "MixedPrecision", state: dict[str, Any]) -> list[str]:
    """Restore :func:`engine_state` into ``amp``; returns the notes a person should see (the caller warns)."""
    notes: list[str] = []
    saved = state.get("precision")
    amp.steps = int(state.get("steps", 0))
    amp._micro = int(state.get("micro", amp.steps * amp.accumulation_steps))
    amp._windows.reset(int(state.get("window", amp._micro % amp.accumulation_steps)))
    amp._schedules.clear()
    amp._guards.steps_of.clear()  # schedulers count their steps from here
    amp._update_pending = False
    counters = state.get("counters")
    if counters is not None:
        amp._counters = DeviceCounters(amp.device.torch_device, amp.scaler)
        amp._counters.load_saved(counters)
    scaler_state = state.get("scaler")
    if amp.scaler is not None:
        if scaler_state:
            amp.scaler.load_state_dict(scaler_state)
        else:
            notes.append(f"checkpoint was {saved} without a loss scaler: starting a fresh FP16 scaler "
                         f"(scale {amp.config.init_scale:g})")
    elif scaler_state:
        notes.append(f"checkpoint was {saved} with a loss scaler; {amp.precision.name} needs none: "
                     "scaler state dropped")
    remainders = state.get("remainders")
    if amp.master is not None and remainders:
        notes += amp.master.load_state_dict(remainders)
    elif amp.master is not None and amp.config.weights == "bf16":
        notes.append("the checkpoint has no BF16 remainders (saved without weights='bf16'): training continues "
                     "from the BF16 rounding of its weights")
    elif remainders and amp.master is None:
        notes.append("the checkpoint was saved with weights='bf16'; this engine keeps FP32 weights: the "
                     "remainders were dropped (call amp.attach(model) with weights='bf16' to keep them)")
    saved_fp32, now_fp32 = state.get("fp32_modules"), amp.config.to_dict()["fp32_modules"]
    if saved_fp32 is not None and list(saved_fp32) != now_fp32:
        notes.append(f"checkpoint kept {list(saved_fp32) or 'no modules'} in FP32, this engine keeps "
                     f"{now_fp32 or 'none'}: pass the same fp32_modules (and amp.attach(model)) to resume alike")
    return notes
