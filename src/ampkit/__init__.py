"""ampkit: mixed-precision training for PyTorch, right by construction and proven on your hardware.

>>> import ampkit
>>> prec = ampkit.resolve_precision("auto")                 # doctest: +SKIP
>>> amp = ampkit.MixedPrecision(prec, max_grad_norm=1.0)    # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

from ampkit import _moved

__version__ = "0.1.0"

_moved.install()  # old module paths (ampkit.policy, ampkit.trainer, ...) for one more release

# Public name -> module. Imported lazily so `ampkit migrate` does not pay for torch-heavy modules
# and a missing optional dependency only fails the feature that needs it.
_EXPORTS = {
    "Device": "ampkit.device",
    "detect_device": "ampkit.device",
    "Capabilities": "ampkit.device.hardware",
    "capabilities": "ampkit.device.hardware",
    "Precision": "ampkit.device.policy",
    "resolve_precision": "ampkit.device.policy",
    "MixedPrecision": "ampkit.engine",
    "AmpConfig": "ampkit.engine.config",
    "save_checkpoint": "ampkit.checkpoint",
    "load_checkpoint": "ampkit.checkpoint",
    "restore": "ampkit.checkpoint",
    "Task": "ampkit.tasks",
    "load_task": "ampkit.tasks",
    "train": "ampkit.training.trainer",
    "TrainConfig": "ampkit.training.config",
    "Callback": "ampkit.training.callbacks",
    "TrainState": "ampkit.training.callbacks",
    "compare": "ampkit.verify.compare",
    "audit": "ampkit.verify.audit",
    "AmpkitError": "ampkit.errors",
    "PrecisionUnsupported": "ampkit.errors",
    "UsageError": "ampkit.errors",
    "CheckpointError": "ampkit.errors",
    "CheckpointMismatch": "ampkit.errors",
    "TrainingHalted": "ampkit.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ampkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
