"""The one place precision is decided.

>>> prec = resolve_precision("auto")            # BF16 where supported, else FP16, else FP32
>>> prec.name, prec.use_scaler, prec.reason     # doctest: +SKIP
('bf16', False, 'auto: NVIDIA H200 (capability 9.0) supports BF16 (table, confirmed by probe): same exponent range
 as FP32, no loss scaling')

An explicit request the device cannot honour raises :class:`PrecisionUnsupported` naming the
card and the fix; only ``auto`` chooses, and it says why. ``fp32`` is the full fallback:
autocast and scaler disabled, nothing else changes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from ampkit.device import Device, detect_device
from ampkit.errors import PrecisionUnsupported, UsageError
from ampkit.device.hardware import Capabilities, capabilities

__all__ = ["Precision", "resolve_precision", "PRECISION_CHOICES", "apply_tf32", "restore_tf32", "tf32_applied",
           "supports", "bf16_advice"]

from ampkit.choices import PRECISION_CHOICES, precision_name  # noqa: E402  (PRECISION_CHOICES re-exported)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# fp8: BF16 autocast around torchao's FP8 linear layers (ampkit.engine.fp8.convert); not a dtype of its own here.
_AUTOCAST_DTYPES = {**_DTYPES, "fp8": torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class Precision:
    """A resolved precision: what autocast computes in, whether a loss scaler runs, and why.

    >>> p = ampkit.resolve_precision("fp32", "cpu")
    >>> p.name, p.dtype, p.use_scaler, p.autocast_enabled
    ('fp32', torch.float32, False, False)
    """

    name: str  # "fp32" | "bf16" | "fp16" | "fp8" (BF16 autocast + FP8 linear layers from ampkit.engine.fp8.convert)
    dtype: torch.dtype  # autocast compute dtype (float32 for fp32: autocast disabled)
    use_scaler: bool  # true only for fp16
    tf32: bool  # TF32 for the FP32 matmuls that remain
    reason: str
    device: Device
    # Whether this card has BF16, as decided with this precision (None: not asked, e.g. plain FP32): the
    # FP16 overflow advice (:func:`bf16_advice`) reads it instead of deciding again.
    bf16_supported: bool | None = None

    @property
    def autocast_enabled(self) -> bool:
        return self.name != "fp32"

    @property
    def is_low_precision(self) -> bool:
        return self.name in ("bf16", "fp16", "fp8")

    def autocast(self) -> torch.autocast:
        """``torch.autocast`` for this precision on its device (disabled for fp32)."""
        return torch.autocast(device_type=self.device.type, dtype=self.dtype, enabled=self.autocast_enabled)


_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def _normalise(requested: "str | torch.dtype") -> str:
    if isinstance(requested, torch.dtype):
        if requested not in _DTYPE_NAMES:
            raise UsageError(f"unsupported precision dtype {requested}: use torch.float32, torch.bfloat16 or "
                             "torch.float16 (or a name: " + ", ".join(PRECISION_CHOICES) + ")")
        return _DTYPE_NAMES[requested]
    if not isinstance(requested, str):
        raise UsageError(f"precision must be a name ({', '.join(PRECISION_CHOICES)}), a torch.dtype or a "
                         f"Precision, got {type(requested).__name__}")
    name = precision_name(requested)
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
    # ``name`` (bf16 or fp16) is unsupported, so at most the other one is left.
    return f"{label} supports {ok[0].upper()} only: use --precision {ok[0]} ({why})"


def resolve_precision(
    requested: "str | torch.dtype | Precision" = "auto",
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
    AMP where the card has TF32) controls TF32 for the FP32 matmuls; ``tf32=True`` on a card
    without TF32 is refused, for ``fp32`` too.

    ``requested`` may be a name in any case (``"BF16"``), a ``torch.dtype`` (``torch.bfloat16``) or a
    :class:`Precision`, which is returned as it is.

    >>> resolve_precision(torch.float32, "cpu").name
    'fp32'
    >>> prec = ampkit.resolve_precision("auto", "cpu")
    >>> prec.name in ("bf16", "fp16", "fp32"), prec.reason.startswith("auto:")
    (True, True)
    """
    if isinstance(requested, Precision):
        return requested
    name = _normalise(requested)
    if isinstance(device, str):
        device = detect_device(device)
    device = device or detect_device()
    if name == "fp32" and caps is None and not tf32:
        # Nothing to check: FP32 without TF32 runs everywhere, so no probe is paid for it.
        return _make("fp32", device, tf32=False, reason="FP32 requested: autocast and loss scaling disabled")
    caps = caps or capabilities(device, probe=probe, fp8_probe=probe and name == "fp8")
    has_tf32 = bool(caps.tf32.supported)
    if tf32 and not has_tf32:
        raise PrecisionUnsupported(f"{_card_label(caps)} has no TF32: drop --tf32")
    if name == "fp32":
        return _make("fp32", device, tf32=bool(tf32), reason="FP32 requested: autocast and loss scaling disabled",
                     caps=caps)
    use_tf32 = has_tf32 if tf32 is None else tf32
    if name == "auto":
        label = _card_label(caps)
        for cand in ("bf16", "fp16"):
            support = caps.dtypes[cand]
            if support.supported:
                src = support.provenance + (f", {support.detail}" if support.detail else "")
                # FP16 is reached only where BF16 is unsupported: the reason says why not.
                why = ("same exponent range as FP32, no loss scaling" if cand == "bf16"
                       else f"BF16 {_why_not(caps, 'bf16')}; FP16 with a dynamic loss scaler")
                return _make(cand, device, tf32=use_tf32, reason=f"auto: {label} supports {cand.upper()} ({src}): {why}",
                             caps=caps)
        return _make("fp32", device, tf32=use_tf32, caps=caps,
                     reason=f"auto: {label} supports neither BF16 nor FP16 here: FP32")
    if name == "fp8":
        return _resolve_fp8(caps, device, tf32=use_tf32)
    support = caps.dtypes[name]
    if not support.supported:
        raise PrecisionUnsupported(_refusal(caps, name))
    src = support.provenance + (f", {support.detail}" if support.detail else "")
    return _make(name, device, tf32=use_tf32, caps=caps,
                 reason=f"{name.upper()} requested; {_card_label(caps)} supports it ({src})")


def _resolve_fp8(caps: Capabilities, device: Device, *, tf32: bool) -> Precision:
    """FP8 needs FP8 matmuls and BF16 (the autocast around them) on the card, and torchao installed."""
    if not (caps.fp8.supported and caps.dtypes["bf16"].supported):
        ok = _supported_list(caps)
        has = " and ".join(n.upper() for n in ok) if ok else "neither BF16 nor FP16"
        missing = "FP8" if not caps.fp8.supported else "BF16 (the autocast FP8 training runs in)"
        evidence = _evidence(caps.fp8 if not caps.fp8.supported else caps.dtypes["bf16"])
        raise PrecisionUnsupported(f"{_card_label(caps)} has no FP8 training (it supports {has}; {missing}: "
                                   f"{evidence}): use --precision {ok[0] if ok else 'fp32'}")
    from ampkit.compat import torchao_missing

    missing = torchao_missing()
    if missing:
        raise PrecisionUnsupported(missing)
    src = caps.fp8.provenance + (f", {caps.fp8.detail}" if caps.fp8.detail else "")
    return _make("fp8", device, tf32=tf32, caps=caps, reason=f"FP8 requested; {_card_label(caps)} supports it ({src}): "
                                                  "BF16 autocast with torchao FP8 linear layers, no loss scaling")


def _why_not(caps: Capabilities, name: str) -> str:
    s = caps.dtypes[name]
    if s.supported is None:
        return "unverified"
    return f"not supported ({s.provenance})"


def _make(name: str, device: Device, *, tf32: bool, reason: str, caps: Capabilities | None = None) -> Precision:
    return Precision(
        name=name,
        dtype=_AUTOCAST_DTYPES[name],
        use_scaler=name == "fp16",
        tf32=tf32,
        reason=reason,
        device=device,
        bf16_supported=None if caps is None else bool(caps.dtypes["bf16"].supported),
    )


def apply_tf32(precision: Precision) -> dict[str, bool]:
    """Set the device's TF32 switches to ``precision.tf32``; returns what was set, by name.

    This changes process-wide torch state: undo it with :func:`restore_tf32` (or use
    :func:`tf32_applied`), passing what ``precision.device.tf32_switches()`` returned before.
    """
    return precision.device.set_tf32(precision.tf32)


def restore_tf32(device: Device, before: dict[str, bool]) -> None:
    """Put every TF32 switch back to the value it had (``before``: ``device.tf32_switches()``)."""
    device.restore_tf32(before)


@contextlib.contextmanager
def tf32_applied(precision: Precision) -> Iterator[dict[str, bool]]:
    """TF32 switches set for ``precision`` inside the block, each restored to its own old value after.

    >>> prec = resolve_precision("fp32", "cpu")
    >>> with tf32_applied(prec) as switched:
    ...     pass                       # the CPU has no TF32 switches: nothing is set
    >>> switched
    {}
    """
    before = precision.device.tf32_switches()
    try:
        yield apply_tf32(precision)
    finally:
        restore_tf32(precision.device, before)


def supports(name: "str | torch.dtype", device: Device | str | None = None, *, probe: bool = True) -> bool:
    """Whether ``--precision name`` would be accepted here: the same strict decision as
    :func:`resolve_precision` (card table first, probe second; emulated BF16 is a no).

    >>> supports("fp32", "cpu")
    True
    """
    try:
        resolve_precision(name, device, probe=probe)
    except PrecisionUnsupported:
        return False
    return True


def bf16_advice(device: Precision | Device | str | None = None) -> str:
    """The one "what to do when FP16 keeps overflowing" advice: BF16 where the card has it, else a
    lower learning rate. Used by the scale monitor, compare and diagnose.

    Given the run's :class:`Precision`, it reads what that decision found (no second decision);
    given a device, it decides whether BF16 would be accepted there.
    """
    if isinstance(device, Precision):
        known = device.bf16_supported
        if known is not None:
            return _advice(known)
        device = device.device
    return _advice(supports("bf16", device))


def _advice(has_bf16: bool) -> str:
    if has_bf16:
        return "use --precision bf16 (this card has BF16: no loss scaling needed)"
    return "lower the learning rate"
