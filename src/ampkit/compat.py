"""Every private or version-dependent torch API ampkit uses, in one place, with its gate.

ampkit promises ``torch>=2.5`` (the oldest release current torch_musa builds on). Code elsewhere calls
these functions instead of reaching into ``torch.amp.GradScaler`` internals or calling APIs that
appeared after 2.5, so a torch upgrade that moves an internal breaks this module and its tests only.

What lives here and why it is needed:

* GradScaler's scale and growth tracker (``_scale``, ``_growth_tracker``): the engine keeps them in its
  own device block (one allocation, no host reads) and clamps the scale to a floor torch lacks.
* GradScaler's per-optimizer found-inf flags (``_found_inf_per_device``, ``_per_optimizer_states``):
  the engine's skip decision is the flag ``unscale_`` already computed, made to agree across ranks.
* The fused-optimizer protocol (``_step_supports_amp_scaling``, ``grad_scale`` / ``found_inf``
  attributes read by fused ``step()``): how a skipped step is skipped on the device.
* ``torch.nn.utils.get_total_norm`` (torch 2.6+), and the ``torch._foreach_*`` kernels (one launch for
  several small tensors: the engine's counters and learning rates).
* torchao, the optional FP8 dependency: whether it is installed, and its import with the one-line
  error (the device layer's FP8 probe and the engine's FP8 conversion both need it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
from typing import Any, Iterator

import torch

__all__ = [
    "INSTALL_HINT",
    "torchao_missing",
    "quiet_torchao_import",
    "require_torchao",
    "TORCH_VERSION",
    "HAS_GET_TOTAL_NORM",
    "scaler_tensors",
    "adopt_scaler_tensors",
    "scaler_init_values",
    "clamp_scale_",
    "found_inf_flags",
    "forget_unscale",
    "supports_found_inf",
    "fused_step",
    "total_norm",
    "foreach_add_",
    "foreach_copy_",
    "fsdp2",
]


def _version(text: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


#: (major, minor) of the running torch.
TORCH_VERSION: tuple[int, int] = _version(torch.__version__)
#: ``torch.nn.utils.get_total_norm`` appeared in torch 2.6.
HAS_GET_TOTAL_NORM: bool = hasattr(torch.nn.utils, "get_total_norm")


# ---------------------------------------------------------------------- GradScaler internals
def scaler_tensors(scaler: torch.amp.GradScaler) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The scaler's (scale, growth tracker) device tensors; None before its first ``scale()``."""
    return scaler._scale, scaler._growth_tracker


def adopt_scaler_tensors(scaler: torch.amp.GradScaler, scale: torch.Tensor, tracker: torch.Tensor) -> None:
    """Make the scaler use ``scale`` (float32, one element) and ``tracker`` (int32, one element) as its
    state: torch then updates them in place (``_amp_update_scale_``)."""
    scaler._scale = scale
    scaler._growth_tracker = tracker


def scaler_init_values(scaler: torch.amp.GradScaler) -> tuple[float, int]:
    """(initial scale, initial growth tracker) that the scaler would start from."""
    return float(scaler._init_scale), int(scaler._init_growth_tracker)


def clamp_scale_(scaler: torch.amp.GradScaler, floor: float) -> None:
    """Keep the scale at or above ``floor`` (on the device; no-op before the first ``scale()``)."""
    if scaler._scale is not None:
        scaler._scale.clamp_(min=floor)


def found_inf_flags(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The found-inf flags ``unscale_(optimizer)`` recorded (one float32 tensor per device)."""
    return list(scaler._found_inf_per_device(optimizer).values())


def forget_unscale(scaler: torch.amp.GradScaler) -> None:
    """Drop every per-optimizer record (an ``unscale_`` that must not count, e.g. a failed capture)."""
    scaler._per_optimizer_states.clear()


# ---------------------------------------------------------------------- fused optimizers
def supports_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """True when ``optimizer.step()`` takes the found-inf flag on the device (torch's fused kernels)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and bool(
        optimizer.defaults.get("fused", False))


def fused_step(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """Step a fused optimizer whose gradients are already unscaled: the kernel skips the update, and rolls
    back its step count, on the device where ``found_inf`` is 1."""
    optimizer.grad_scale = None  # type: ignore[attr-defined]
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale  # type: ignore[attr-defined]
        del optimizer.found_inf  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- norms
def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of ``grads`` without changing them. DTensor (FSDP2) shards are reduced over ranks
    (the result is then a DTensor: take ``full_tensor()``)."""
    dev = grads[0].device
    if hasattr(grads[0], "full_tensor"):
        if HAS_GET_TOTAL_NORM:
            return torch.nn.utils.get_total_norm(grads)
        # torch 2.5: what get_total_norm does, one gradient at a time (DTensor norms stack and reduce).
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))


def foreach_add_(tensors: list[torch.Tensor], others: list[torch.Tensor]) -> None:
    """``tensors[i] += others[i]`` in one launch."""
    torch._foreach_add_(tensors, others)


def foreach_copy_(tensors: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``tensors[i].copy_(sources[i])`` in one launch."""
    torch._foreach_copy_(tensors, sources)


# ---------------------------------------------------------------------- FSDP2
def fsdp2() -> tuple[Any, Any]:
    """``(fully_shard, MixedPrecisionPolicy)``: public in ``torch.distributed.fsdp`` from torch 2.6, under
    ``torch.distributed._composable.fsdp`` in 2.5 (the oldest release promised)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


# ---------------------------------------------------------------------- torch.compile
@contextlib.contextmanager
def recompile_limit(at_least: int) -> Iterator[None]:
    """Let Dynamo compile one function for at least ``at_least`` guards (shapes, module instances) inside the
    block: past the limit it silently runs the frame eagerly. The setting is ``recompile_limit`` from torch
    2.7 on, ``cache_size_limit`` before."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    with cfg.patch(**{name: max(int(getattr(cfg, name)), at_least)}):
        yield


# Optional dependencies, imported only when a feature needs them.
INSTALL_HINT = "pip install 'ampkit[fp8]' (torchao)"


def torchao_missing() -> str | None:
    """None when torchao can be imported; else the one-line reason with the install command."""
    if importlib.util.find_spec("torchao") is None:
        return f"FP8 training needs torchao, which is not installed: {INSTALL_HINT}"
    return None


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    # torchao logs a warning for each optional C extension built for other GPUs that it cannot load
    # (cutlass sm90a, mxfp8 ...); the float8 training path does not use them.
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def require_torchao() -> Any:
    """Import and return ``torchao.float8``; :class:`~ampkit.errors.AmpkitError` (one line) when missing."""
    from ampkit.errors import AmpkitError

    missing = torchao_missing()
    if missing:
        raise AmpkitError(missing)
    try:
        with quiet_torchao_import():
            import torchao.float8 as float8
    except Exception as exc:  # noqa: BLE001 - a broken install (ABI mismatch with torch) is the finding
        from ampkit.errors import first_line

        raise AmpkitError(f"torchao is installed but cannot be imported ({first_line(exc, 160)}): install a "
                          "torchao release built for this torch (see the torchao compatibility table)") from None
    return float8
