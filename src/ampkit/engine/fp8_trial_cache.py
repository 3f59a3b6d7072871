"""The FP8 trial's cache: a decision measured once is reused for the same model, batch, card, mode and versions.

The key holds what the measured step times depend on: a fingerprint of the model's structure (every module's
qualified name and class, every parameter's name, shape and dtype), the batch's shapes and dtypes, the card
and its capability, the mode (eager or compiled), the recipe, the rule's minimum gain and the torch, torchao and
ampkit versions. Anything else (another batch size, a new torch) finds no entry and is measured again. Each
entry keeps its provenance: when it was measured, the ampkit commit, what the trial cost.

The file is ``$AMPKIT_FP8_DECISION_CACHE`` when set, else ``$XDG_CACHE_HOME/ampkit/fp8-decisions.json``
(``~/.cache/ampkit/fp8-decisions.json``). An unreadable file is ignored (rewritten by the next trial).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.atomic import atomic_write_bytes
from ampkit.engine.fp8_trial import TrialResult

__all__ = ["cache_path", "trial_key", "structure_fingerprint", "batch_signature", "load_trial", "save_trial"]

SCHEMA = 1


def cache_path() -> Path:
    """Where trial results are cached: ``$AMPKIT_FP8_DECISION_CACHE``, else the user's cache folder."""
    if os.environ.get("AMPKIT_FP8_DECISION_CACHE"):
        return Path(os.environ["AMPKIT_FP8_DECISION_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ampkit" / "fp8-decisions.json"


def structure_fingerprint(model: nn.Module) -> str:
    """A hash of the model's modules (name, class) and parameters (name, shape, dtype): not of the weights."""
    h = hashlib.sha256()
    for name, m in model.named_modules():
        h.update(f"m {name} {type(m).__module__}.{type(m).__qualname__}\n".encode())
    for name, p in model.named_parameters():
        h.update(f"p {name} {tuple(p.shape)} {p.dtype}\n".encode())
    return h.hexdigest()[:20]


def batch_signature(batch: Any) -> list[Any]:
    """The shapes and dtypes of a (nested) batch's tensors, in order."""
    if isinstance(batch, torch.Tensor):
        return [list(batch.shape), str(batch.dtype).replace("torch.", "")]
    if isinstance(batch, dict):
        return [[str(k), batch_signature(v)] for k, v in batch.items()]
    if isinstance(batch, (tuple, list)):
        return [batch_signature(v) for v in batch]
    return [type(batch).__name__]


def _version(pkg: str) -> str | None:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def trial_key(model: nn.Module, batch: Any, *, card: str, capability: Any, mode: str, recipe: str,
              min_gain: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a cached decision holds for (``extra``: anything else the caller's step depends on)."""
    return {"structure": structure_fingerprint(model), "batch": batch_signature(batch), "card": card,
            "capability": list(capability) if capability is not None else None, "mode": mode, "recipe": recipe,
            "min_gain": min_gain, "torch": torch.__version__, "torchao": _version("torchao"),
            "ampkit": _version("ampkit"), **(extra or {})}


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
        entries = data["entries"] if data.get("schema") == SCHEMA else []
        return [e for e in entries if isinstance(e, dict) and "key" in e and "result" in e]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # missing, unreadable or another schema: as if empty


def load_trial(key: dict[str, Any], path: Path | None = None) -> TrialResult | None:
    """The cached result for exactly ``key`` (its ``cached`` naming the file), or None."""
    path = path or cache_path()
    for entry in _entries(path):
        if entry["key"] == key:
            try:
                return TrialResult.from_dict(entry["result"], cached=str(path))
            except (ValueError, KeyError, TypeError):
                return None
    return None


def save_trial(key: dict[str, Any], result: TrialResult, path: Path | None = None) -> Path:
    """Add (or replace) the entry for ``key``, keeping the others; written atomically."""
    path = path or cache_path()
    entries = [e for e in _entries(path) if e["key"] != key] + [{"key": key, "result": result.to_dict()}]
    data = (json.dumps({"schema": SCHEMA, "entries": entries}, indent=1) + "\n").encode()
    return atomic_write_bytes(path, lambda fh: fh.write(data))
