"""What goes into a checkpoint: the plain module's names (``torch.compile`` and DDP wrappers stripped on save
and accepted on load) and only values that ``torch.load(weights_only=True)`` rebuilds, checked at save time.
Used by :mod:`ampkit.checkpoint`."""

from __future__ import annotations

import collections
import functools
import io
from typing import Any

import torch
from torch import nn

from ampkit.errors import CheckpointError, CheckpointMismatch

__all__ = ["unwrap_model", "model_state", "load_model_state", "check_loadable", "some_keys"]

_COMPILED = "_orig_mod"  # torch.compile's OptimizedModule keeps the user's module under this name


# ---------------------------------------------------------------------------- wrappers
def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside ``torch.compile`` (``_orig_mod``) and DDP (``module``) wrappers, in any nesting.
    FSDP2's ``fully_shard`` shards in place and keeps the plain names: such a model is its own module."""
    while True:
        inner = getattr(model, _COMPILED, None)
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def _plain_key(key: str) -> str:
    # A compiled submodule (model.encoder = torch.compile(encoder)) puts "_orig_mod." inside its keys.
    return ".".join(part for part in key.split(".") if part != _COMPILED)


def model_state(model: nn.Module) -> dict[str, Any]:
    state = unwrap_model(model).state_dict()
    if not any(_COMPILED in key.split(".") for key in state):
        return state
    return collections.OrderedDict((_plain_key(k), v) for k, v in state.items())


def load_model_state(model: nn.Module, saved: dict[str, Any]) -> None:
    """Load plain-named ``saved`` into ``model`` (plain or wrapped); names saved by a wrapped model
    (``module.``, ``_orig_mod.``) are accepted too. A mismatch is one CheckpointError line."""
    target = unwrap_model(model)
    wanted = target.state_dict()
    saved = {_plain_key(k): v for k, v in saved.items()}
    if saved and all(k.startswith("module.") for k in saved) and not any(k.startswith("module.") for k in wanted):
        saved = {k[len("module."):]: v for k, v in saved.items()}  # a DDP model's state_dict() saved as is
    actual = {_plain_key(k): k for k in wanted}
    remapped = {actual.get(k, k): v for k, v in saved.items()}
    missing = [k for k in wanted if k not in remapped]
    unexpected = [k for k in remapped if k not in wanted]
    if missing or unexpected:
        parts = [f"{label} {some_keys(keys)}" for label, keys in (("missing", missing), ("unexpected", unexpected))
                 if keys]
        raise CheckpointMismatch(f"the checkpoint's model does not fit {type(target).__name__}: {'; '.join(parts)}")
    try:
        target.load_state_dict(remapped)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise CheckpointMismatch(f"the checkpoint's model does not fit {type(target).__name__}: "
                                 f"{(lines[1] if len(lines) > 1 else lines[0] if lines else exc)[:200]}") from exc


def some_keys(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


# ---------------------------------------------------------------------------- what weights_only loads
# The types torch.load(weights_only=True) rebuilds (tests/test_checkpoint.py checks the agreement value by
# value), less tensor subclasses: it loads FSDP2's DTensor shards, but a one-file checkpoint of shards does not
# load into a plain model, so they are refused too. Anything else is refused at save time, naming the key.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Size, torch.dtype, torch.device,
          torch.layout, torch.qscheme, torch.Tensor, nn.Parameter)
_SEQUENCES = (list, tuple, set)
_MAPPINGS = (dict, collections.OrderedDict, collections.Counter)


@functools.cache
def _weights_only_loads(kind: type) -> bool:
    """Whether this torch's ``weights_only=True`` loader rebuilds ``kind`` (complex numbers and sets came in
    later releases than torch 2.5): asked of torch itself once, with a tiny value."""
    sample = {complex: 1j, set: {1}}[kind]
    buf = io.BytesIO()
    torch.save(sample, buf)
    buf.seek(0)
    try:
        return torch.load(buf, weights_only=True) == sample
    except Exception:  # noqa: BLE001 - the unpickler's refusal type differs between releases
        return False


def check_loadable(value: Any, where: str) -> None:
    """Raise a one-line :class:`CheckpointError` naming the first key of ``value`` that
    ``torch.load(weights_only=True)`` would refuse (an object, a function, a numpy array, ...)."""
    kind = type(value)
    if kind in _PLAIN and (kind is not complex or _weights_only_loads(complex)):
        return
    if kind in _SEQUENCES and (kind is not set or _weights_only_loads(set)):
        for i, item in enumerate(value):
            check_loadable(item, f"{where}[{i}]" if kind is not set else f"{where} item {_fmt(item)}")
        return
    if kind in _MAPPINGS:
        for key, item in value.items():
            check_loadable(key, f"{where} key {_fmt(key)}")
            check_loadable(item, f"{where}[{_fmt(key)}]")
        return
    what = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if kind.__name__ == "DTensor":
        hint = "a sharded (FSDP2) tensor: save sharded models in the DCP format (ampkit train --strategy fsdp)"
    elif isinstance(value, torch.Tensor):
        hint = "a tensor subclass: save a plain tensor there (e.g. t.detach().clone().as_subclass(torch.Tensor))"
    else:
        hint = "keep only tensors and plain python values (int, float, str, bool, None, list, tuple, dict) there"
    raise CheckpointError(f"{where}: {what} is not loadable with weights_only=True: {hint}")


def _fmt(key: Any) -> str:
    return f'"{key}"' if isinstance(key, str) else repr(key)
