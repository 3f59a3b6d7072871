"""The pieces of one optimizer step, as functions of tensors: the engine composes them in
:meth:`ampkit.MixedPrecision.step`. Nothing here keeps state.

* :func:`params_of` reads parameters from ``optimizer.param_groups`` every step: a group added with
  ``add_param_group`` after the first step is clipped and checked like the others.
* :func:`clip_and_flag` computes ONE global norm over every stepped optimizer (clipping to it when asked)
  and the non-finite flag, which always covers every parameter of the stepped optimizers, whatever
  subset ``parameters=`` clips.
* :func:`apply` steps each optimizer, skipping the update where the flag is set: on the device for fused
  optimizers, after one host read (for all of them together) otherwise.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Sequence

import torch

from ampkit import compat
from ampkit.errors import AmpkitError, UsageError

__all__ = ["params_of", "check_optimizer", "check_weights", "clip_and_flag", "apply", "is_fused", "full"]


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer can take the found-inf flag on the device (torch's fused kernels)."""
    return compat.supports_found_inf(optimizer)


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's gradient norm comes back as one); other tensors unchanged."""
    whole = getattr(t, "full_tensor", None)
    return whole() if callable(whole) else t


def params_of(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """Every parameter of ``optimizers``, read from their param_groups now (each once)."""
    seen: set[int] = set()
    out = []
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def check_optimizer(optimizer: object) -> None:
    """UsageError for what ``amp.step`` cannot step: not an optimizer, or one that needs a closure."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"amp.step takes torch optimizers, got {type(optimizer).__name__}: "
                         "amp.step(optimizer) or amp.step(opt_a, opt_b)")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise UsageError("LBFGS re-evaluates the loss through a closure, which loss scaling and skipping cannot "
                         "follow: use torch.optim.LBFGS without amp.step (optimizer.step(closure), in FP32 or "
                         "inside amp.autocast() for BF16), or a first-order optimizer such as AdamW")


def check_weights(params: Iterable[torch.Tensor], precision_name: str, use_scaler: bool) -> None:
    """Refuse FP16 weights under loss scaling; warn about low-precision weights without FP32 master copies."""
    low = {torch.float16: 0, torch.bfloat16: 0}
    for p in params:
        if p.dtype in low:
            low[p.dtype] += 1
    if use_scaler and low[torch.float16]:
        raise AmpkitError(
            f"{low[torch.float16]} parameter(s) are FP16 while FP16 loss scaling is on: the optimizer would "
            "update FP16 weights (torch says 'Attempting to unscale FP16 gradients'). Keep the model in FP32 "
            "(remove model.half() / .to(torch.float16)) and let autocast cast: the weights stay FP32 master copies")
    for dtype, count in low.items():
        if count and not use_scaler:
            name = "BF16" if dtype == torch.bfloat16 else "FP16"
            warnings.warn(
                f"ampkit: {count} parameter(s) are {name} under {precision_name}: the optimizer updates them with no "
                f"FP32 master copy, so small updates round away. Keep the model in FP32 (remove "
                f"model.{'bfloat16' if name == 'BF16' else 'half'}()) and let autocast cast", stacklevel=4)


def _nonfinite(norm: torch.Tensor) -> torch.Tensor:
    # x - x is 0 for a finite x and NaN for inf/NaN; ne_ turns that into 0.0 / 1.0 in place.
    n = norm.detach().float()
    return (n - n).ne_(0)


def clip_and_flag(params: list[torch.Tensor], clip: list[torch.Tensor] | None, max_norm: float | None,
                  scaler_flags: list[torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(global norm of the clipped set, non-finite flag over ALL ``params``) as device tensors.

    ``clip``: the subset to clip and measure (None: all). ``scaler_flags``: the found-inf flags
    ``unscale_`` recorded (FP16), which already cover every gradient; else the flag comes from norms.
    """
    target = params if clip is None else clip
    grads = [p.grad for p in target if p.grad is not None]
    if not grads:
        dev = target[0].device if target else params[0].device
        norm = torch.zeros((), device=dev)
    elif max_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(target, max_norm)
    else:
        norm = compat.total_norm(grads)
    norm = full(norm)
    if scaler_flags:
        found = scaler_flags[0]
        for flag in scaler_flags[1:]:
            found = torch.maximum(found, flag.to(found.device, non_blocking=True))
        return norm, found
    found = _nonfinite(norm)
    if clip is not None:  # the skip decision covers what was not clipped too
        chosen = {id(p) for p in clip}
        rest = [p.grad for p in params if id(p) not in chosen and p.grad is not None]
        if rest:
            found = torch.maximum(found, _nonfinite(full(compat.total_norm(rest))).to(found.device))
    return norm, found


def apply(optimizers: Sequence[torch.optim.Optimizer], found: torch.Tensor) -> bool | None:
    """Step every optimizer unless ``found``. Returns the host's view of the skip when it had to read
    it (a non-fused optimizer was stepped), else None (decided on the device)."""
    skipped: bool | None = None
    for opt in optimizers:
        if is_fused(opt):
            compat.fused_step(opt, found)
            continue
        if skipped is None:
            skipped = bool(found)  # one host read for all non-fused optimizers of this step
        if not skipped:
            opt.step()
    return skipped
