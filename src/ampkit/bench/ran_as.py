"""What a peer library really ran: the autocast state inside its step, against the precision it was asked for.

Lightning Fabric takes ``precision="16-mixed"`` on the CPU and runs BF16 instead, with a warning and nothing in
its return values (``Fabric(accelerator="cpu", precision="16-mixed")`` becomes ``bf16-mixed``). A bench row
labelled FP16 would then time BF16 (issue 45). :class:`AutocastProbe` records the autocast dtype the model's
forward actually runs under, and :func:`check_ran` turns a different one into :class:`Substituted`: the row is
dropped with a note that names what ran, instead of being timed under the wrong label.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["AutocastProbe", "Substituted", "check_ran"]

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


class Substituted(Exception):
    """A peer ran another precision than the one asked for (its row is not timed; the message says what ran)."""


class AutocastProbe:
    """Records, at the model's first forward, the precision autocast runs it in: "fp16", "bf16", "fp32" (autocast
    off) or the dtype's name. A forward pre-hook on the model itself: a peer's wrapper enters its autocast before
    it calls the model (Fabric's ``_FabricModule.forward``), so the hook sees the peer's own setting."""

    def __init__(self, model: nn.Module, device_type: str) -> None:
        self.device_type = device_type
        self.ran: str | None = None
        self._handle = model.register_forward_pre_hook(self._seen)

    def _seen(self, module: nn.Module, args: Any) -> None:
        if self.ran is None:
            on = torch.is_autocast_enabled(self.device_type)
            dtype = torch.get_autocast_dtype(self.device_type) if on else torch.float32
            self.ran = "fp32" if dtype == torch.float32 else _NAMES.get(dtype, str(dtype).replace("torch.", ""))

    def remove(self) -> None:
        self._handle.remove()


def check_ran(probe: AutocastProbe, asked: str, *, peer: str, setting: str) -> None:
    """Raise :class:`Substituted` when the probe saw another precision than ``asked`` ("fp16", "bf16", "fp32")."""
    if probe.ran is not None and probe.ran != asked:
        raise Substituted(f"{peer} ran {probe.ran.upper()} when asked for {asked.upper()} (precision={setting!r} on "
                          f"{probe.device_type}; autocast dtype inside its step): not timed as {asked.upper()}")
