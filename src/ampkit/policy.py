"""The one place precision is decided.

>>> prec = resolve_precision("auto")            # BF16 where supported, else FP16, else FP32
>>> prec.name, prec.use_scaler, prec.reason     # doctest: +SKIP
('bf16', False, 'NVIDIA H200 supports BF16 (table, confirmed by probe): same range as FP32, no loss scaling')

An explicit request the device cannot honour raises :class:`PrecisionUnsupported` naming the
card and the fix; only ``auto`` chooses, and it says why. ``fp32`` is the full fallback:
autocast and scaler disabled, nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.device import Device, detect_device
from ampkit.errors import PrecisionUnsupported, UsageError
from ampkit.hardware import Capabilities, capabilities

__all__ = ["Precision", "resolve_precision", "PRECISION_CHOICES", "apply_tf32"]

from ampkit.choices import PRECISION_CHOICES  # noqa: E402  (re-exported)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


@dataclass(frozen=True, kw_only=True)
class Precision:
    """A resolved precision: what autocast computes in, whether a loss scaler runs, and why.

    >>> p = ampkit.resolve_precision("fp32", "cpu")
    >>> p.name, p.dtype, p.use_scaler, p.autocast_enabled
    ('fp32', torch.float32, False, False)
    """

    name: str  # "fp32" | "bf16" | "fp16"
    dtype: torch.dtype  # autocast compute dtype (float32 for fp32: autocast disabled)
    use_scaler: bool  # true only for fp16
    tf32: bool  # TF32 for the FP32 matmuls that remain
    reason: str
    device: Device

    @property
    def autocast_enabled(self) -> bool:
        return self.name != "fp32"

    @property
    def is_low_precision(self) -> bool:
        return self.name in ("bf16", "fp16")

    def autocast(self) -> torch.autocast:
        """``torch.autocast`` for this precision on its device (disabled for fp32)."""
        return torch.autocast(device_type=self.device.type, dtype=self.dtype, enabled=self.autocast_enabled)


def _normalise(requested: str) -> str:
    name = str(requested).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in PRECISION_CHOICES:
        raise UsageError(f"unknown precision {requested!r}: use one of {', '.join(PRECISION_CHOICES)}")
    return name


def _card_label(caps: Capabilities) -> str:
    bits = []
    if caps.arch and caps.device.is_musa:
        bits.append(caps.arch.split(" ")[0])
    if caps.capability:
        bits.append(f"capability {caps.capability[0]}.{caps.capability[1]}")
    return f"{caps.name} ({', '.join(bits)})" if bits else caps.name


def _supported_list(caps: Capabilities) -> list[str]:
    return [n for n in ("bf16", "fp16") if caps.dtypes[n].supported]


def _evidence(support) -> str:
    """Where a "no" came from, for the message's parenthesis."""
    if support.provenance == "table":
        text = "the card table says no"
        if support.probe and not support.probe.startswith("pass"):
            text += f"; run-time probe: {support.probe}"
        elif support.probe:
            text += " (a small probe passed: emulation, not used)"
        return text
    if support.provenance == "probe":
        return f"the run-time probe says no ({support.probe})"
    return "unverified: no card-table entry and no probe result"


def _refusal(caps: Capabilities, name: str) -> str:
    """The fix first, then the evidence: 'MTT S80 (QY1, capability 2.1) supports FP16 only: use --precision fp16 (...)'."""
    label = _card_label(caps)
    ok = _supported_list(caps)
    why = f"{name.upper()}: {_evidence(caps.dtypes[name])}"
    if not ok:
        return f"{label} supports neither BF16 nor FP16 here: use --precision fp32 ({why})"
    if len(ok) == 1:
        return f"{label} supports {ok[0].upper()} only: use --precision {ok[0]} ({why})"
    return f"{label} does not support {name.upper()}: use --precision {' or '.join(ok)} ({why})"


def resolve_precision(
    requested: str = "auto",
    device: Device | str | None = None,
    *,
    tf32: bool | None = None,
    probe: bool = True,
    caps: Capabilities | None = None,
) -> Precision:
    """Decide the training precision for ``device`` (detected when None).

    ``auto`` picks BF16 where supported, else FP16 (with a loss scaler), else FP32, and
    says why. An explicit ``bf16``/``fp16`` the device cannot do raises
    :class:`~ampkit.errors.PrecisionUnsupported`. ``tf32`` (default: off for ``fp32``, on for
    AMP where the card has TF32) controls TF32 for the FP32 matmuls.

    >>> prec = ampkit.resolve_precision("auto", "cpu")
    >>> prec.name in ("bf16", "fp16", "fp32"), prec.reason.startswith("auto:")
    (True, True)
    """
    name = _normalise(requested)
    if isinstance(device, str):
        device = detect_device(device)
    device = device or detect_device()
    if name == "fp32" and caps is None:
        return _make("fp32", device, tf32=bool(tf32), reason="FP32 requested: autocast and loss scaling disabled")
    caps = caps or capabilities(device, probe=probe)
    has_tf32 = bool(caps.tf32.supported)
    if tf32 and not has_tf32:
        raise PrecisionUnsupported(f"{_card_label(caps)} has no TF32: drop --tf32")
    if name == "fp32":
        return _make("fp32", device, tf32=bool(tf32), reason="FP32 requested: autocast and loss scaling disabled")
    use_tf32 = has_tf32 if tf32 is None else tf32
    if name == "auto":
        label = _card_label(caps)
        for cand in ("bf16", "fp16"):
            support = caps.dtypes[cand]
            if support.supported:
                src = support.provenance + (f", {support.detail}" if support.detail else "")
                why = ("same exponent range as FP32, no loss scaling" if cand == "bf16"
                       else "BF16 unavailable here; FP16 with a dynamic loss scaler")
                if cand == "fp16" and not caps.dtypes["bf16"].supported:
                    why = f"BF16 {_why_not(caps, 'bf16')}; FP16 with a dynamic loss scaler"
                return _make(cand, device, tf32=use_tf32, reason=f"auto: {label} supports {cand.upper()} ({src}): {why}")
        return _make("fp32", device, tf32=use_tf32,
                     reason=f"auto: {label} supports neither BF16 nor FP16 here: FP32")
    support = caps.dtypes[name]
    if not support.supported:
        raise PrecisionUnsupported(_refusal(caps, name))
    src = support.provenance + (f", {support.detail}" if support.detail else "")
    return _make(name, device, tf32=use_tf32, reason=f"{name.upper()} requested; {_card_label(caps)} supports it ({src})")


def _why_not(caps: Capabilities, name: str) -> str:
    s = caps.dtypes[name]
    if s.supported is None:
        return "unverified"
    return f"not supported ({s.provenance})"


def _make(name: str, device: Device, *, tf32: bool, reason: str) -> Precision:
    return Precision(
        name=name,
        dtype=_DTYPES[name],
        use_scaler=name == "fp16",
        tf32=tf32,
        reason=reason,
        device=device,
    )


def apply_tf32(precision: Precision) -> dict[str, bool]:
    """Set the device's TF32 switches to ``precision.tf32``; returns what was set, by name."""
    return precision.device.set_tf32(precision.tf32)
