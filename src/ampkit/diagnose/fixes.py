"""Fix texts that name the user's own module, function or precision (the generic ones live in the
registry, :mod:`ampkit.findings`). Plain functions of plain values, so each is tested directly."""

from __future__ import annotations

__all__ = ["keep_fp32_fix", "scale_text", "clip_fix", "cause_fix", "not_precision_fix", "half_cast_fix"]


def scale_text(scale: float) -> str:
    """``65536`` / ``0.25``: how an init scale is written on a command line."""
    return f"{scale:g}"


def keep_fp32_fix(module: str, init_scale: float | None, *, fp16: bool = True) -> str:
    """Keep ``module`` (its qualified name inside the model) in FP32, with the exact flag for ``ampkit
    train`` and the Python API; with FP16, the initial loss scale to use (None: not known here)."""
    text = (f"keep `{module}` in FP32: `ampkit train --fp32-modules {module}` "
            f"(Python: `MixedPrecision(..., fp32_modules=[\"{module}\"])`; by hand: "
            "`with torch.autocast(device_type, enabled=False): y = module(x.float())`)")
    if fp16 and init_scale is not None:
        text += (f"; start the FP16 loss scale at `--init-scale {scale_text(init_scale)}` "
                 f"(`torch.amp.GradScaler(device_type, init_scale={scale_text(init_scale)})`)")
    elif fp16:
        text += "; `ampkit diagnose --fp16-range SCRIPT` gives the initial loss scale (`--init-scale X`)"
    return text + "; or use BF16 where the card has it (`ampkit doctor`)"


def clip_fix(function: str) -> str:
    """``clip-before-unscale`` naming the clipping function the script called."""
    return (f"call `scaler.unscale_(optimizer)` before `torch.nn.utils.{function}(...)`, "
            "then `scaler.step(optimizer)` and `scaler.update()`")


def cause_fix(cause: str, detail: str) -> str:
    """The first thing to change for a classified non-finite op (see :mod:`ampkit.diagnose.oplocate`),
    put before the generic fix; "" when the module-level fix is the one to give."""
    if cause == "overflow" and detail.startswith("the constant"):
        return ("use a constant the low-precision dtype holds (`torch.finfo(scores.dtype).min` for a mask, or build "
                "the mask and add it in FP32); ")
    if cause == "underflow":
        return ("use an eps the low-precision dtype holds (FP16: 1e-5 or more; its smallest positive value is "
                "6e-08), or compute this op in FP32; ")
    return ""


def not_precision_fix() -> str:
    """A forward inf/NaN that FP32 gives as well: guard the op, not the precision."""
    return ("guard the op itself, AMP is not the cause: a softmax row whose every key is masked with -inf gives NaN "
            "(keep at least one visible key per row, or fill with `torch.finfo(scores.dtype).min`); a division, "
            "sqrt or log needs its argument kept away from 0 (`x.clamp_min(eps)`); check the batch with "
            "`torch.isfinite(x).all()`")


def half_cast_fix(where: str, text: str) -> str:
    """``fp16-params-with-scaler`` naming the line that made the weights FP16 and what it says there."""
    quoted = f" (`{text}`)" if text else ""
    return (f"keep the weights in FP32: remove the cast to FP16 at {where}{quoted}; "
            "`torch.autocast(device_type, dtype=torch.float16)` casts per op, the optimizer then updates FP32 "
            "weights and the GradScaler unscales FP32 gradients")
