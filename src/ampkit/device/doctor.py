"""``ampkit doctor`` as data: what this device is, what it supports, what to use, and why."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ampkit import __version__
from ampkit.device import Device, detect_device
from ampkit.errors import PrecisionUnsupported
from ampkit.device.hardware import Capabilities, capabilities
from ampkit.device.policy import resolve_precision

__all__ = ["doctor_report", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


def _support(s: Any) -> dict[str, Any]:
    return asdict(s)


def doctor_report(device: Device | None = None, *, precision: str | None = None, probe: bool = True) -> dict[str, Any]:
    """Everything ``ampkit doctor`` shows, as a JSON-ready dict (stable keys: docs/reference/schemas.md, "doctor --json").

    With ``precision``, ``report["check"]`` says whether it is usable here and why not.
    """
    device = device or detect_device()
    caps: Capabilities = capabilities(device, probe=probe, fp8_probe=probe)
    recommended = resolve_precision("auto", device, caps=caps)
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "ampkit": __version__,
        "device": {
            "type": device.type,
            "index": device.index,
            "name": caps.name,
            "vendor": device.vendor,
            "capability": list(caps.capability) if caps.capability else None,
            "total_memory_bytes": device.total_memory,
        },
        "card": {"family": caps.family, "arch": caps.arch},
        "dtypes": {k: _support(v) for k, v in caps.dtypes.items()},
        "tf32": {**_support(caps.tf32), "switches": device.tf32_switches()},
        "fp8": _support(caps.fp8),
        "collectives": {**_support(caps.collectives), "backend": device.collective_backend},
        "recommended": {"precision": recommended.name, "reason": recommended.reason},
        "probe_ran": probe,
        "versions": device.runtime_versions(),
        "env": device.debug_env(),
        "rerun_hint": device.rerun_hint(),
        "notes": list(caps.notes),
    }
    if precision is not None:
        try:
            chosen = resolve_precision(precision, device, caps=caps)
            report["check"] = {"precision": precision, "usable": True, "resolved": chosen.name, "reason": chosen.reason}
        except PrecisionUnsupported as exc:
            report["check"] = {"precision": precision, "usable": False, "resolved": None, "reason": str(exc)}
    return report
