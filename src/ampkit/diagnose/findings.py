"""Findings: the stable codes of DESIGN.md, their fixes, and the record a diagnose run returns.

A :class:`Finding` is plain data (``code, message, where, fix, step``) so it serialises to the
JSON list ``ampkit diagnose --json`` writes. ``FIXES`` holds the generic fix per code; a finding
may carry a more specific one (naming the module or the line to change).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Finding", "FIXES", "CODES", "TITLES", "fix_for"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One defect found at run time.

    ``where`` names the module path and/or ``file:line`` of the user's code; ``step`` is the number
    of optimizer steps completed when it was seen (0 = before the first step), None when it is
    not tied to a step.
    """

    code: str
    message: str
    where: str
    fix: str
    step: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# code -> (one-line title, generic fix). Codes are stable: extend, never rename.
_REGISTRY: dict[str, tuple[str, str]] = {
    "nonfinite-forward": (
        "a forward output became inf/NaN",
        "keep the named module in FP32 (`with torch.autocast(device_type, enabled=False): "
        "y = module(x.float())`), rescale its inputs or weights, or use BF16 where the card has it; "
        "`ampkit diagnose --fp16-range SCRIPT` predicts which modules overflow FP16",
    ),
    "nonfinite-backward": (
        "a gradient became inf/NaN",
        "guard the op against its singular point (e.g. `torch.sqrt(x + eps)`, `x.clamp_min(eps)`), "
        "lower the learning rate, or clip gradients after `scaler.unscale_(optimizer)`",
    ),
    "clip-before-unscale": (
        "gradients clipped while still multiplied by the loss scale",
        "call `scaler.unscale_(optimizer)` before `torch.nn.utils.clip_grad_norm_(...)`, "
        "then `scaler.step(optimizer)` and `scaler.update()`",
    ),
    "fp16-params-with-scaler": (
        "FP16 parameters trained with a GradScaler",
        "keep the model in FP32 (remove `model.half()` / `.to(torch.float16)`) and let "
        "`torch.autocast(device_type, dtype=torch.float16)` cast per op: the optimizer then "
        "updates FP32 master weights and the scaler can unscale FP32 gradients",
    ),
    "fp16-without-scaler": (
        "FP16 autocast without a GradScaler: small gradients underflow to zero",
        "create `scaler = torch.amp.GradScaler(device_type)` and use `scaler.scale(loss).backward()`, "
        "`scaler.step(optimizer)`, `scaler.update()`; or use BF16 where the card has it "
        "(`ampkit doctor`)",
    ),
    "dtype-unsupported": (
        "autocast to a dtype this card cannot run",
        "use the dtype the card supports (`ampkit doctor` names it; MTT S80/S3000: "
        "`dtype=torch.float16` with a GradScaler), or `ampkit doctor --precision bf16` to check first",
    ),
    "scale-collapse": (
        "the loss scale keeps falling",
        "something overflows every step: run `ampkit diagnose --fp16-range SCRIPT` to find the module, "
        "keep it in FP32, lower the learning rate or the loss magnitude, or use BF16 where the card has it",
    ),
    "scaler-not-checkpointed": (
        "checkpoint without the GradScaler state",
        "save `scaler.state_dict()` with the model and optimizer "
        "(`torch.save({'model': ..., 'optimizer': ..., 'scaler': scaler.state_dict()}, path)`) "
        "and restore it with `scaler.load_state_dict(...)`",
    ),
    "half-inside-autocast": (
        "manual cast to FP16 inside an autocast region",
        "remove the manual `.half()` / `.to(torch.float16)`: autocast already casts per op and keeps "
        "precision-sensitive ops (softmax, norms, losses) in FP32",
    ),
    "host-sync-per-step": (
        "host reads a device value every step",
        "keep values on the device and read them every N steps (`loss.detach()` into a list, "
        "`torch.stack(...).mean().item()` when logging); let the GradScaler skip non-finite steps "
        "instead of `if not torch.isfinite(loss)`",
    ),
    "scaler-with-bf16": (
        "an enabled GradScaler under BF16 autocast",
        "BF16 has FP32's exponent range and needs no loss scaling: "
        "`torch.amp.GradScaler(device_type, enabled=(dtype == torch.float16))`",
    ),
    "bce-under-autocast": (
        "binary_cross_entropy under autocast",
        "use `torch.nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits` on the logits",
    ),
    "deprecated-amp-api": (
        "deprecated AMP API",
        "run `ampkit migrate --fix PATH`",
    ),
    "unsafe-torch-load": (
        "torch.load without weights_only=True",
        "pass `weights_only=True` (run `ampkit migrate --fix PATH`)",
    ),
    # Not a defect of AMP use: the script raised something diagnose could not map to a code above.
    "script-error": (
        "the script raised",
        "fix the error shown; to find the failing op rerun with the variables named in the message",
    ),
}

CODES: tuple[str, ...] = tuple(_REGISTRY)
TITLES: dict[str, str] = {code: title for code, (title, _) in _REGISTRY.items()}
FIXES: dict[str, str] = {code: fix for code, (_, fix) in _REGISTRY.items()}


def fix_for(code: str) -> str:
    """The generic fix for ``code`` (KeyError for an unknown code: codes are a closed, stable set)."""
    return FIXES[code]
