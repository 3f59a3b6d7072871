"""What a migrate rule reports: :class:`Finding`, and the stable codes with one line each."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Finding", "CODES"]

# Stable codes (shared with `ampkit diagnose`). Scripts and `--select` depend on the spelling.
CODES: dict[str, str] = {
    "deprecated-amp-api": "a deprecated torch.{cuda,cpu,musa}.amp API that was not (or not fully) rewritten",
    "clip-before-unscale": "gradients clipped while still multiplied by the loss scale",
    "scaler-with-bf16": "a GradScaler that is always enabled next to a bfloat16 autocast",
    "unsafe-torch-load": "torch.load without weights_only=True unpickles arbitrary objects",
    "host-sync-per-step": "a host-device synchronisation (.item(), if torch.isfinite) every training step",
    "bce-under-autocast": "binary_cross_entropy / BCELoss is refused under autocast",
    "half-inside-autocast": "a manual .half() / float16 cast inside an autocast region",
    "hard-coded-device": "a torch.amp call with the device hard-coded to one vendor and no device variable in reach",
}


@dataclass(frozen=True)
class Finding:
    """One problem found in a file.

    ``fix`` is the code to write instead; ``rewritten`` says whether ``--fix`` applies it for you.
    """

    code: str
    message: str
    path: str
    line: int
    fix: str
    rewritten: bool = False

    def where(self) -> str:
        """``path:line``, the form editors and terminals link."""
        return f"{self.path}:{self.line}"
