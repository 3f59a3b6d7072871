"""What a card can do: a card table with provenance, confirmed or contradicted by a run-time probe.

Every answer carries where it came from:

* ``table``: the card table below (MUSA.md for MTT cards, compute capability for NVIDIA);
* ``probe``: a small autocast matmul + softmax + backward ran here and was checked against FP32;
* ``unverified``: nobody knows (e.g. FP16 training on the MTT S5000) and no probe ran.

The table wins over the probe where it has an answer: an MTT S80 can *create* BF16 tensors
(the ``is_bf16_supported()`` emulation trap) but its BF16 ops fail, so BF16 stays "no".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from ampkit import compat
from ampkit.device.layer import Device
from ampkit.errors import first_line

__all__ = [
    "Support",
    "Capabilities",
    "CardFacts",
    "ProbeResult",
    "card_facts",
    "probe_dtype",
    "probe_fp8",
    "capabilities",
    "LOW_DTYPES",
]

Provenance = Literal["table", "probe", "unverified"]
LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Support:
    """One yes/no answer with its provenance. ``supported`` is None when unknown."""

    supported: bool | None
    provenance: Provenance
    detail: str = ""
    probe: str | None = None  # "pass", "fail: ...", "error: ...", or None when not run


@dataclass(frozen=True)
class CardFacts:
    """A row of the card table."""

    family: str  # e.g. "MTT S80", "NVIDIA sm_90", "CPU"
    arch: str | None
    fp16: bool | None
    bf16: bool | None
    tf32: bool | None
    fp8: bool | None
    collectives: bool | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What the device supports, per feature, each with provenance.

    >>> caps = ampkit.capabilities(ampkit.Device("cpu"), probe=False)
    >>> caps.dtypes["fp32"].supported, caps.dtypes["fp32"].provenance
    (True, 'table')
    """

    device: Device
    name: str
    capability: tuple[int, int] | None
    family: str
    arch: str | None
    dtypes: dict[str, Support]  # keys: fp32, bf16, fp16
    tf32: Support
    fp8: Support
    collectives: Support
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    message: str
    max_rel_error: float | None = None
    errored: bool = False  # the probe could not run (driver error, missing kernel): not a verdict


# ---------------------------------------------------------------------------- the card table
_S80 = CardFacts("MTT S80/S3000 (QY1)", "QY1 (mp_21)", True, False, False, False, False,
                 ("no BF16: use FP16 with a loss scaler", "no MCCL: multi-GPU training is not supported"))
_S4000 = CardFacts("MTT S4000/S90 (QY2)", "QY2 (mp_22)", True, True, True, False, True,
                   ("TF32 TensorCore for FP32 matmul", "MUSA graphs available from QY2"))
_S5000 = CardFacts("MTT S5000 (PH1)", "PH1 (mp_31)", None, True, True, True, True,
                   ("FP16 training has no official statement: BF16 recommended",
                    "FP8 _scaled_mm available (arch >= 3.1), no FP8 autocast"))
_S2000 = CardFacts("MTT S2000", None, None, False, False, False, False, ("old card; not a training target",))

_MUSA_BY_NAME = {
    "MTT S80": _S80,
    "MTT S80ES": _S80,
    "MTT S3000": _S80,
    "MTT S4000": _S4000,
    "MTT S90": _S4000,
    "MTT S5000": _S5000,
    "MTT S2000": _S2000,
}


def _musa_facts(name: str, cap: tuple[int, int] | None) -> CardFacts:
    key = name.strip().upper()
    for card, facts in _MUSA_BY_NAME.items():
        if key == card:
            return replace(facts, family=f"{card} ({facts.arch})" if facts.arch else card)
    # Unknown MTT card: decide by capability (many names share one capability; MUSA.md).
    if cap is None:
        return CardFacts(f"unknown MUSA card {name!r}", None, None, None, None, None, None,
                         ("unknown card and no capability: run-time probe decides",))
    base = _S5000 if cap >= (3, 1) else _S4000 if cap >= (2, 2) else _S80 if cap >= (2, 1) else _S2000
    return replace(base, family=f"{name} (unknown card, treated as {base.family} by capability {cap[0]}.{cap[1]})")


def _nvidia_facts(cap: tuple[int, int] | None) -> CardFacts:
    if cap is None:
        return CardFacts("NVIDIA (capability unknown)", None, None, None, None, None, True)
    major, minor = cap
    notes = []
    if cap < (7, 0):
        notes.append("no FP16 tensor cores before compute capability 7.0: AMP gives little speed-up")
    if cap < (8, 0):
        notes.append("BF16 needs compute capability 8.0 (Ampere); is_bf16_supported() may still say True (emulation)")
    return CardFacts(
        family=f"NVIDIA sm_{major}{minor}",
        arch=f"sm_{major}{minor}",
        fp16=cap >= (6, 0),
        bf16=cap >= (8, 0),
        tf32=cap >= (8, 0),
        fp8=cap >= (8, 9),
        collectives=True,
        notes=tuple(notes),
    )


_CPU = CardFacts("CPU", None, None, None, False, False, True,
                 ("CPU autocast support depends on the installed torch: the probe decides",
                  "autocast on the CPU is often slower than FP32; it is for testing numerics"))


def card_facts(device: Device, name: str | None = None, capability: tuple[int, int] | None = None) -> CardFacts:
    """The table's row for this device (no code runs on the device)."""
    name = device.name if name is None else name
    cap = device.capability if capability is None else capability
    if device.type == "musa":
        return _musa_facts(name, cap)
    if device.type == "cuda":
        return _nvidia_facts(cap)
    if device.type == "cpu":
        return _CPU
    return CardFacts(device.type.upper(), None, None, None, None, None, None, ("no card table: the probe decides",))


# ---------------------------------------------------------------------------- the probe
def probe_dtype(device: Device, dtype: torch.dtype, *, rtol: float = 5e-2) -> ProbeResult:
    """Run a small autocast matmul, softmax and backward in ``dtype`` and check it against FP32.

    Returns ok=False with the reason when the output is not in ``dtype`` (autocast silently
    disabled), not finite, or too far from the FP32 reference; ``errored=True`` when the
    device raised (driver error, missing kernel).
    """
    try:
        gen = torch.Generator().manual_seed(0)
        a_cpu = torch.randn(64, 64, generator=gen)
        w_cpu = torch.randn(64, 64, generator=gen) / 8
        dev = device.torch_device

        def run(low: bool) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
            a = a_cpu.to(dev)
            w = w_cpu.to(dev).requires_grad_(True)
            with torch.autocast(device_type=device.type, dtype=dtype, enabled=low):
                h = a @ w
                out_dtype = h.dtype
                p = torch.softmax(h, dim=-1)
                loss = (p * torch.arange(64, device=dev, dtype=p.dtype)).sum()
            loss.backward()
            return p.float().detach().cpu(), w.grad.detach().float().cpu(), out_dtype

        p_low, g_low, out_dtype = run(True)
        p_ref, g_ref, _ = run(False)
        device.synchronize()
    except Exception as exc:  # noqa: BLE001 - anything the device raises is the finding
        return ProbeResult(False, f"error: {first_line(exc, 200)}", errored=True)
    if out_dtype != dtype:
        return ProbeResult(False, f"fail: autocast produced {out_dtype} instead of {dtype} (not supported here)")
    if not (torch.isfinite(p_low).all() and torch.isfinite(g_low).all()):
        return ProbeResult(False, "fail: non-finite output or gradient")
    err_p = float(((p_low - p_ref).abs().max() / p_ref.abs().max().clamp_min(1e-12)))
    err_g = float(((g_low - g_ref).abs().max() / g_ref.abs().max().clamp_min(1e-12)))
    err = max(err_p, err_g)
    if err > rtol:
        return ProbeResult(False, f"fail: relative error {err:.3g} against FP32 exceeds {rtol}", err)
    return ProbeResult(True, f"pass (max relative error {err:.2g})", err)


def probe_fp8(device: Device, *, rtol: float = 0.1) -> ProbeResult:
    """FP8 training probe: a tiny torchao ``Float8Linear`` (tensorwise) forward and backward under BF16
    autocast, checked against the same layer in BF16 (output and weight gradient).

    ``errored=True`` when it cannot run (torchao missing, no FP8 kernel on this device).
    """
    missing = compat.torchao_missing()
    if missing:
        return ProbeResult(False, f"error: not run: {missing}", errored=True)
    try:
        import copy

        float8 = compat.require_torchao()
        dev = device.torch_device
        gen = torch.Generator().manual_seed(0)
        x_cpu = torch.randn(64, 64, generator=gen)
        ref_layer = torch.nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            ref_layer.weight.copy_(torch.randn(64, 64, generator=gen) / 8)
        ref_layer = ref_layer.to(dev)
        fp8_layer = float8.convert_to_float8_training(
            torch.nn.Sequential(copy.deepcopy(ref_layer)),
            config=float8.Float8LinearConfig.from_recipe_name("tensorwise"))

        def run(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                out = model(x_cpu.to(dev))
            out.float().square().mean().backward()
            weight = next(model.parameters())
            return out.float().detach().cpu(), weight.grad.detach().float().cpu()

        kind = type(fp8_layer[0]).__name__
        out_8, grad_8 = run(fp8_layer)
        out_ref, grad_ref = run(ref_layer)
        device.synchronize()
    except Exception as exc:  # noqa: BLE001 - anything the device raises is the finding
        return ProbeResult(False, f"error: {first_line(exc, 200)}", errored=True)
    if kind != "Float8Linear":
        return ProbeResult(False, f"fail: torchao left the layer as {kind}")
    if not (torch.isfinite(out_8).all() and torch.isfinite(grad_8).all()):
        return ProbeResult(False, "fail: non-finite FP8 output or gradient")
    err_o = float((out_8 - out_ref).abs().max() / out_ref.abs().max().clamp_min(1e-12))
    err_g = float((grad_8 - grad_ref).abs().max() / grad_ref.abs().max().clamp_min(1e-12))
    err = max(err_o, err_g)
    if err > rtol:
        return ProbeResult(False, f"fail: FP8 relative error {err:.3g} against BF16 exceeds {rtol}", err)
    return ProbeResult(True, f"pass (FP8 vs BF16 max relative error {err:.2g})", err)


def _combine(table: bool | None, probe: ProbeResult | None, what: str) -> Support:
    if table is not None:
        if probe is None:
            return Support(table, "table", "", None)
        if probe.errored:
            return Support(table, "table", "probe could not run; table answer kept", probe.message)
        if probe.ok == table:
            return Support(table, "table", "confirmed by probe", probe.message)
        if table and not probe.ok:
            # The card should do it but did not here: trust what ran (driver, build or kernel problem).
            return Support(False, "probe", "table says yes but the probe failed here", probe.message)
        # Table says no, probe passed: the emulation trap. The table wins.
        return Support(False, "table", f"{what} ops passed a small probe but the card table says no "
                                        "(emulation); not used", probe.message)
    if probe is None:
        return Support(None, "unverified", "no table entry and no probe run", None)
    if probe.errored:
        return Support(None, "unverified", "no table entry and the probe could not run", probe.message)
    return Support(probe.ok, "probe", "decided by the run-time probe", probe.message)


def capabilities(device: Device, *, probe: bool = True, fp8_probe: bool = False) -> Capabilities:
    """The table's answer per dtype, confirmed or contradicted by a run-time probe when ``probe``.

    ``fp8_probe`` also runs :func:`probe_fp8` (needs torchao; seconds, so only ``doctor`` and an
    explicit ``fp8`` request ask for it), except where the card table already says no FP8.

    >>> caps = ampkit.capabilities(ampkit.detect_device("cpu"))   # runs the probe: what really works here
    >>> sorted(caps.dtypes)
    ['bf16', 'fp16', 'fp32']
    """
    name = device.name
    cap = device.capability
    facts = card_facts(device, name, cap)
    dtypes: dict[str, Support] = {"fp32": Support(True, "table", "always")}
    for key, dtype in LOW_DTYPES.items():
        table = getattr(facts, key)
        result = probe_dtype(device, dtype) if probe else None
        dtypes[key] = _combine(table, result, key.upper())
    notes = list(facts.notes)
    strict = device.strict_bf16_supported()
    if strict is not None and facts.bf16 is not None and strict != facts.bf16:
        notes.append(f"is_bf16_supported(including_emulation=False) says {strict}; the card table says {facts.bf16}")
    return Capabilities(
        device=device,
        name=name,
        capability=cap,
        family=facts.family,
        arch=facts.arch,
        dtypes=dtypes,
        tf32=_combine(facts.tf32, None, "TF32"),
        fp8=_combine(facts.fp8, probe_fp8(device) if fp8_probe and facts.fp8 is not False else None, "FP8"),
        collectives=_combine(facts.collectives, None, "collectives"),
        notes=tuple(notes),
    )
