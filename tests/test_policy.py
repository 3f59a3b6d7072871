import pytest
import torch

from ampkit.device import Device
from ampkit.errors import PrecisionUnsupported, UsageError
from ampkit.device.policy import apply_tf32, bf16_advice, resolve_precision, supports, tf32_applied


def test_auto_on_cpu_picks_bf16_with_reason():
    p = resolve_precision("auto", Device("cpu"))
    assert p.name == "bf16" and p.dtype == torch.bfloat16 and not p.use_scaler
    assert "auto" in p.reason and "BF16" in p.reason


def test_fp16_uses_scaler_fp32_disables_everything():
    p = resolve_precision("fp16", Device("cpu"))
    assert p.use_scaler and p.dtype == torch.float16
    f = resolve_precision("fp32", Device("cpu"))
    assert not f.use_scaler and not f.autocast_enabled and not f.tf32


def test_precision_is_frozen():
    p = resolve_precision("fp32", Device("cpu"))
    with pytest.raises(Exception):
        p.name = "bf16"


def test_unknown_precision():
    with pytest.raises(UsageError):
        resolve_precision("fp4", Device("cpu"))  # fp8 is a precision now (ampkit.engine.fp8)


def test_s80_refuses_bf16_naming_card_and_fix(simulated_musa):
    simulated_musa("MTT S80")
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("bf16")
    msg = str(e.value)
    assert msg.startswith("MTT S80 (QY1, capability 2.1) supports FP16 only: use --precision fp16 (BF16: the card "
                          "table says no")


def test_s80_auto_is_fp16_and_says_why(simulated_musa):
    simulated_musa("MTT S80")
    p = resolve_precision("auto")
    assert p.name == "fp16" and p.use_scaler
    assert "BF16" in p.reason and "scaler" in p.reason


def test_s4000_auto_bf16_with_tf32(simulated_musa):
    simulated_musa("MTT S4000")
    p = resolve_precision("auto")
    assert p.name == "bf16" and p.tf32
    assert apply_tf32(p) == {"torch.backends.mudnn.allow_tf32": True}


def test_s5000_auto_recommends_bf16(simulated_musa):
    simulated_musa("MTT S5000")
    assert resolve_precision("auto").name == "bf16"
    assert resolve_precision("fp16").reason.find("probe") >= 0


def test_v100_bf16_refused_despite_emulation(simulated_cuda):
    simulated_cuda((7, 0))
    assert torch.cuda.is_bf16_supported()  # the trap
    with pytest.raises(PrecisionUnsupported, match="use --precision fp16"):
        resolve_precision("bf16")
    assert resolve_precision("auto").name == "fp16"


def test_tf32_on_a_card_without_it(simulated_cuda):
    simulated_cuda((7, 0))
    with pytest.raises(PrecisionUnsupported, match="no TF32"):
        resolve_precision("fp16", tf32=True)


@pytest.fixture
def cuda_tf32():
    """Set torch's two CUDA TF32 switches for one test and put them back after. Plain setattr: on torch 2.5
    cuBLAS's switch is a property that monkeypatch cannot look up."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)

    def set_(*, matmul: bool, cudnn: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn

    yield set_
    matmul.allow_tf32, cudnn.allow_tf32 = before


def test_s80_with_a_passing_bf16_probe_still_refuses_bf16(simulated_musa):
    # The emulation trap at its worst: BF16 tensors can be made and a small probe even runs. The card table
    # (QY1 has no BF16) wins, the refusal says the probe passed but was not used, and auto picks FP16.
    simulated_musa("MTT S80", bf16_probe_passes=True)
    with pytest.raises(PrecisionUnsupported) as e:
        resolve_precision("bf16")
    assert "supports FP16 only: use --precision fp16" in str(e.value)
    assert "probe passed: emulation, not used" in str(e.value)
    auto = resolve_precision("auto")
    assert auto.name == "fp16" and auto.use_scaler
    assert not supports("bf16") and supports("fp16")
    assert bf16_advice() == "lower the learning rate"


@pytest.mark.parametrize("card", ["s4000", "a100"])
def test_fp32_on_an_accelerator_leaves_tf32_off(card, simulated_musa, simulated_cuda, cuda_tf32):
    # --precision fp32 means FP32 matmuls: TF32 stays off, and no switch is ever set to True.
    if card == "s4000":
        simulated_musa("MTT S4000", v29_matmul=True, tf32_on=False)
    else:
        simulated_cuda((8, 0))
        cuda_tf32(matmul=False, cudnn=False)
    prec = resolve_precision("fp32")
    assert prec.tf32 is False
    with tf32_applied(prec) as switched:
        assert switched and not any(switched.values())
        assert not any(prec.device.tf32_switches().values())
    assert not any(prec.device.tf32_switches().values())


def test_tf32_context_restores_each_switch_to_its_own_value(simulated_cuda, cuda_tf32):
    simulated_cuda((8, 0))
    cuda_tf32(matmul=False, cudnn=True)  # torch's defaults: mixed
    before = {"torch.backends.cuda.matmul.allow_tf32": False, "torch.backends.cudnn.allow_tf32": True}
    for tf32 in (False, True):
        prec = resolve_precision("fp32", tf32=tf32)
        with tf32_applied(prec):
            assert set(prec.device.tf32_switches().values()) == {tf32}
        assert prec.device.tf32_switches() == before


@pytest.mark.parametrize("capability", [(7, 0)])
def test_fp32_with_tf32_is_checked_like_every_precision(simulated_cuda, capability):
    simulated_cuda(capability)
    with pytest.raises(PrecisionUnsupported, match="no TF32"):
        resolve_precision("fp32", tf32=True)


def test_fp32_with_tf32_refused_on_the_cpu():
    with pytest.raises(PrecisionUnsupported, match="no TF32"):
        resolve_precision("fp32", Device("cpu"), tf32=True)


def test_fp32_with_tf32_refused_on_s80(simulated_musa):
    simulated_musa("MTT S80")
    with pytest.raises(PrecisionUnsupported, match="MTT S80.*no TF32"):
        resolve_precision("fp32", tf32=True)


@pytest.mark.parametrize("requested,name", [
    ("BF16", "bf16"), (" Fp16 ", "fp16"), ("FP32", "fp32"), ("bfloat16", "bf16"), ("half", "fp16"),
    (torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32"),
])
def test_precision_names_dtypes_any_case(requested, name):
    assert resolve_precision(requested, "cpu").name == name


def test_precision_object_passes_through():
    p = resolve_precision("fp16", "cpu")
    assert resolve_precision(p) is p


@pytest.mark.parametrize("bad", [torch.int8, torch.float64, 3, None.__class__])
def test_bad_precision_types_are_usage_errors(bad):
    with pytest.raises(UsageError, match="precision"):
        resolve_precision(bad, "cpu")


def test_the_engine_puts_tf32_back_when_closed(simulated_cuda, cuda_tf32):
    # MixedPrecision("fp32") turns TF32 off for its run, and only for its run.
    from ampkit.engine import MixedPrecision

    simulated_cuda((8, 0))
    cuda_tf32(matmul=False, cudnn=True)  # torch's defaults
    before = {"torch.backends.cuda.matmul.allow_tf32": False, "torch.backends.cudnn.allow_tf32": True}
    amp = MixedPrecision("fp32")
    assert not any(amp.device.tf32_switches().values())
    amp.close()
    assert amp.device.tf32_switches() == before
    amp.close()  # idempotent
    assert amp.device.tf32_switches() == before
    with MixedPrecision("bf16") as amp:
        assert all(amp.device.tf32_switches().values())  # AMP on an A100: TF32 for the FP32 matmuls left
    assert amp.device.tf32_switches() == before
