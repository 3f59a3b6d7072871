import pytest
import torch

from ampkit.device import Device
from ampkit.errors import PrecisionUnsupported, UsageError
from ampkit.policy import apply_tf32, resolve_precision


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
        resolve_precision("fp8", Device("cpu"))


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
