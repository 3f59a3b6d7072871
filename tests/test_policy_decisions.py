"""resolve_precision's decisions and the exact text users see (the CLI prints ``reason`` and refusals as they are).

Written from a mutation-testing pass over ampkit.device.policy: each test pins a decision or a message that an
earlier suite let change silently (which device is asked, TF32 on/off, which probe runs, the wording).
"""

import warnings

import pytest
import torch

from ampkit.device import hardware
from ampkit.device import Device
from ampkit.errors import PrecisionUnsupported, UsageError
from ampkit.engine.fp8 import torchao_missing
from ampkit.device.policy import PRECISION_CHOICES, bf16_advice, resolve_precision, supports

CPU_NAME = Device("cpu").name  # the host's CPU model: differs between machines
CHOICES = ", ".join(PRECISION_CHOICES)
S80 = "MTT S80 (QY1, capability 2.1)"
S4000 = "MTT S4000 (QY2, capability 2.2)"
S5000 = "MTT S5000 (PH1, capability 3.1)"
A100 = "NVIDIA A100-SXM4-80GB (capability 8.0)"
H100 = "NVIDIA H100 80GB HBM3 (capability 9.0)"
FP32_REASON = "FP32 requested: autocast and loss scaling disabled"
needs_torchao = pytest.mark.skipif(torchao_missing() is not None, reason="torchao is not installed (ampkit[fp8])")


def _count_calls(monkeypatch, name: str) -> list:
    """Wrap hardware.<name> (the real probe, or the simulated one a fixture installed) to record each call."""
    real, calls = getattr(hardware, name), []

    def counted(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(hardware, name, counted)
    return calls


def _bf16_probe_fails(monkeypatch) -> None:
    """The card's table says BF16, but BF16 gives NaNs here (a driver or build problem): the probe's verdict wins."""
    real = hardware.probe_dtype

    def probe(device, dtype, **kw):
        if dtype == torch.bfloat16:
            return hardware.ProbeResult(False, "fail: non-finite output or gradient")
        return real(device, dtype, **kw)

    monkeypatch.setattr(hardware, "probe_dtype", probe)


# ------------------------------------------------------------------------------ auto: the choice and its reason
def test_auto_reasons_word_for_word(simulated_musa):
    simulated_musa("MTT S4000")
    assert resolve_precision("auto").reason == (
        f"auto: {S4000} supports BF16 (table, confirmed by probe): same exponent range as FP32, no loss scaling")
    assert resolve_precision("auto", probe=False).reason == (
        f"auto: {S4000} supports BF16 (table): same exponent range as FP32, no loss scaling")


def test_auto_fp16_reason_says_why_not_bf16(simulated_musa):
    simulated_musa("MTT S80")
    p = resolve_precision("auto")
    assert (p.name, p.use_scaler, p.tf32) == ("fp16", True, False)
    assert p.reason == (f"auto: {S80} supports FP16 (table, confirmed by probe): BF16 not supported (table); "
                        "FP16 with a dynamic loss scaler")


def test_auto_falls_back_to_fp16_when_the_bf16_probe_fails(simulated_cuda, monkeypatch):
    simulated_cuda((8, 0))
    _bf16_probe_fails(monkeypatch)
    p = resolve_precision("auto")
    assert (p.name, p.use_scaler, p.tf32) == ("fp16", True, True)
    assert p.reason == (f"auto: {A100} supports FP16 (table, confirmed by probe): BF16 not supported (probe); "
                        "FP16 with a dynamic loss scaler")


def test_auto_fp16_when_bf16_is_unverified(simulated_musa):
    # No table answer and no probe for BF16, FP16 known good: auto says BF16 is unverified, not "not supported".
    import dataclasses

    from ampkit.device.hardware import Support, capabilities

    simulated_musa("MTT S80")
    caps = capabilities(Device("musa"), probe=False)
    caps = dataclasses.replace(caps, dtypes={**caps.dtypes, "bf16": Support(None, "unverified")})
    p = resolve_precision("auto", caps.device, caps=caps)
    assert p.name == "fp16"
    assert p.reason == f"auto: {S80} supports FP16 (table): BF16 unverified; FP16 with a dynamic loss scaler"


def test_auto_with_neither_low_precision_is_fp32_without_tf32():
    # The CPU's table has no BF16/FP16 answer; without the probe nothing is known, so auto is FP32.
    p = resolve_precision("auto", "cpu", probe=False)
    assert (p.name, p.dtype, p.use_scaler, p.autocast_enabled) == ("fp32", torch.float32, False, False)
    assert p.tf32 is False and p.device.type == "cpu"
    assert p.reason == f"auto: {CPU_NAME} supports neither BF16 nor FP16 here: FP32"


def test_auto_is_the_default_request(simulated_musa):
    simulated_musa("MTT S4000")
    p = resolve_precision()
    assert (p.name, p.tf32, p.device.type) == ("bf16", True, "musa")


def test_a_device_named_as_a_string_is_the_one_used(simulated_musa):
    # A MUSA card is present, but the caller asked for the CPU: the CPU is decided on, not the card.
    simulated_musa("MTT S4000")
    p = resolve_precision("auto", "cpu")
    assert p.device.type == "cpu" and p.tf32 is False
    assert p.reason.startswith(f"auto: {CPU_NAME} supports BF16 (")


# ------------------------------------------------------------------------------ explicit requests
def test_explicit_reasons_word_for_word(simulated_musa):
    simulated_musa("MTT S4000")
    assert resolve_precision("bf16").reason == f"BF16 requested; {S4000} supports it (table, confirmed by probe)"
    assert resolve_precision("fp16", probe=False).reason == f"FP16 requested; {S4000} supports it (table)"


def test_fp32_reason_is_the_same_with_and_without_tf32(simulated_cuda):
    simulated_cuda((8, 0))
    plain, with_tf32 = resolve_precision("fp32"), resolve_precision("fp32", tf32=True)
    assert (plain.reason, plain.tf32) == (FP32_REASON, False)
    assert (with_tf32.reason, with_tf32.tf32, with_tf32.use_scaler) == (FP32_REASON, True, False)


def test_fp32_pays_for_no_probe(simulated_cuda, monkeypatch):
    simulated_cuda((8, 0))
    calls = _count_calls(monkeypatch, "probe_dtype")
    assert resolve_precision("fp32").name == "fp32"
    assert resolve_precision(torch.float32).name == "fp32"
    assert calls == []
    resolve_precision("bf16")
    assert len(calls) == 2  # BF16 and FP16, once each


def test_probe_false_runs_no_probe(simulated_musa, monkeypatch):
    simulated_musa("MTT S5000")
    calls = _count_calls(monkeypatch, "probe_dtype")
    assert resolve_precision("bf16", probe=False).reason == f"BF16 requested; {S5000} supports it (table)"
    assert calls == []


@pytest.mark.parametrize("name", ["bf16", "fp16", "auto"])
def test_tf32_false_is_honoured_for_amp(simulated_cuda, name):
    simulated_cuda((8, 0))
    assert resolve_precision(name).tf32 is True  # default: TF32 for the FP32 matmuls left, where the card has it
    assert resolve_precision(name, tf32=False).tf32 is False
    assert resolve_precision(name, tf32=True).tf32 is True


# ------------------------------------------------------------------------------ refusals, word for word
def test_s80_bf16_refusal_when_a_small_probe_passes(simulated_musa):
    simulated_musa("MTT S80", bf16_probe_passes=True)
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("bf16")
    assert str(e.value) == (f"{S80} supports FP16 only: use --precision fp16 "
                            "(BF16: the card table says no (a small probe passed: emulation, not used))")


def test_refusal_when_the_probe_contradicts_the_table(simulated_cuda, monkeypatch):
    simulated_cuda((8, 0))
    _bf16_probe_fails(monkeypatch)
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("bf16")
    assert str(e.value) == (f"{A100} supports FP16 only: use --precision fp16 "
                            "(BF16: the run-time probe says no (fail: non-finite output or gradient))")


def test_unverified_fp16_on_s5000_without_probe(simulated_musa):
    # FP16 on the S5000 has no table answer: the probe decides, and with no probe it is refused.
    simulated_musa("MTT S5000")
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("fp16", probe=False)
    assert str(e.value) == (f"{S5000} supports BF16 only: use --precision bf16 "
                            "(FP16: unverified: no card-table entry and no probe result)")
    assert resolve_precision("fp16").reason == (
        f"FP16 requested; {S5000} supports it (probe, decided by the run-time probe)")


def test_no_tf32_refusal_word_for_word(simulated_cuda):
    simulated_cuda((7, 0))
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("bf16", tf32=True)
    assert str(e.value) == "Tesla V100-SXM2-32GB (capability 7.0) has no TF32: drop --tf32"


@pytest.mark.parametrize("requested, message", [
    (torch.int8, "unsupported precision dtype torch.int8: use torch.float32, torch.bfloat16 or torch.float16 "
                 f"(or a name: {CHOICES})"),
    (3, f"precision must be a name ({CHOICES}), a torch.dtype or a Precision, got int"),
    ("fp4", f"unknown precision 'fp4': use one of {CHOICES}"),
])
def test_usage_errors_word_for_word(requested, message):
    with pytest.raises(UsageError) as e:
        resolve_precision(requested, "cpu")
    assert str(e.value) == message


# ------------------------------------------------------------------------------ fp8
def test_fp8_refusal_on_a_device_with_neither_low_precision():
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("fp8", "cpu", probe=False)
    assert str(e.value) == (f"{CPU_NAME} has no FP8 training (it supports neither BF16 nor FP16; "
                            "FP8: the card table says no): use --precision fp32")


def test_fp8_card_whose_bf16_fails_is_refused_for_want_of_bf16(simulated_cuda, monkeypatch):
    from ampkit.device.hardware import capabilities

    simulated_cuda((9, 0))
    _bf16_probe_fails(monkeypatch)
    caps = capabilities(Device("cuda"), probe=True)  # the BF16/FP16 probes, not the FP8 one (seconds: torchao)
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("fp8", caps.device, caps=caps)
    assert str(e.value) == (f"{H100} has no FP8 training (it supports FP16; BF16 (the autocast FP8 training "
                            "runs in): the run-time probe says no (fail: non-finite output or gradient)): "
                            "use --precision fp16")


@needs_torchao
def test_fp8_resolution_keeps_device_tf32_and_reason(simulated_cuda):
    simulated_cuda((9, 0))
    p = resolve_precision("fp8", probe=False)
    assert (p.name, p.device.type, p.tf32, p.use_scaler) == ("fp8", "cuda", True, False)
    assert p.reason == (f"FP8 requested; {H100} supports it (table): "
                        "BF16 autocast with torchao FP8 linear layers, no loss scaling")
    assert resolve_precision("fp8", probe=False, tf32=False).tf32 is False


@needs_torchao
def test_only_an_fp8_request_runs_the_fp8_probe(simulated_cuda, monkeypatch):
    # The FP8 probe costs seconds (torchao): only an fp8 request with probe=True pays for it. It is replaced here
    # by one that records its calls and answers what a machine without the card answers, so the test is fast and
    # reads the same on a CPU and on a GPU host.
    simulated_cuda((9, 0))
    calls = []

    def probe_fp8(device, **kw):
        calls.append(device)
        return hardware.ProbeResult(False, "error: RuntimeError: no FP8 kernel here", errored=True)

    monkeypatch.setattr(hardware, "probe_fp8", probe_fp8)
    resolve_precision("bf16")
    resolve_precision("auto")
    resolve_precision("fp8", probe=False)
    assert calls == []
    p = resolve_precision("fp8")
    assert len(calls) == 1
    assert p.reason == (f"FP8 requested; {H100} supports it (table, probe could not run; table answer kept): "
                        "BF16 autocast with torchao FP8 linear layers, no loss scaling")


# ------------------------------------------------------------------------------ supports / bf16_advice
def test_supports_and_advice_ask_about_the_device_given(simulated_musa):
    # An S80 is present (no BF16); the CPU's BF16 passes the probe. Asking about the CPU answers for the CPU.
    simulated_musa("MTT S80", bf16_probe_passes=True)
    assert supports("bf16") is False and supports("bf16", "cpu") is True
    assert bf16_advice() == "lower the learning rate"
    assert bf16_advice("cpu") == "use --precision bf16 (this card has BF16: no loss scaling needed)"


def test_supports_probes_by_default_and_not_when_told(simulated_musa):
    simulated_musa("MTT S5000")  # FP16: no table answer, the probe passes
    assert supports("fp16") is True
    assert supports("fp16", probe=True) is True
    assert supports("fp16", probe=False) is False


# ------------------------------------------------------------------------------ Precision.autocast
@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_precision_autocast_computes_in_its_dtype(name, dtype):
    p = resolve_precision(name, "cpu")
    a = torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fp32 must not ask the CPU for an FP32 autocast (a warning each step)
        with p.autocast():
            assert torch.is_autocast_enabled("cpu") is (name != "fp32")
            assert (a @ a).dtype == dtype
