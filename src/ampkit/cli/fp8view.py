"""How the CLI shows the measured FP8 decision while it runs (events of :mod:`ampkit.engine.fp8_trial`)."""

from __future__ import annotations

from typing import Any

__all__ = ["fp8_trial_line"]


def fp8_trial_line(ev: dict[str, Any]) -> str | None:
    """One line for a ``{"event": "fp8_trial", ...}`` progress event, or None for events shown otherwise."""
    if ev.get("event") != "fp8_trial":
        return None
    phase = ev.get("phase")
    if phase == "start":
        sets = ", ".join(f"{c['name']} ({c['converted']} layers in FP8)" for c in ev["candidates"])
        return f"FP8 decision: timing {len(ev['candidates'])} layer sets on this model ({ev['mode']}): {sets}"
    if phase == "build":
        return f"  FP8 trial: building {ev['candidate']} ({ev['index'] + 1}/{ev['total']})"
    if phase == "round":
        return f"  FP8 trial round {ev['round'] + 1}: {ev['candidate']} {ev['ms']:.2f} ms/step"
    if phase in ("done", "cached"):
        return ev["summary"]
    return None
