"""Pure low-precision scripts (ampkit.diagnose.dtype_switch): in FP32 runs the conversions to BF16/FP16 of weights
and inputs are no-ops, recorded; in AMP runs they happen, recorded; a parameter created in BF16 is refused by name.
In-process with the real Switch (fast); the end-to-end comparisons are in tests/verify/test_script_reach.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit.cli import main
from ampkit.diagnose.script_run import run_script
from ampkit.diagnose.switch import Refusal, Switch

HERE = os.path.dirname(os.path.abspath(__file__))
PURE = str(Path(HERE).parent / "verify" / "scripts" / "pure_bf16.py")


def test_fp32_run_keeps_weights_and_inputs_fp32():
    with Switch(mode="fp32", seed=0, user_dir=HERE) as sw:
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)).to(torch.bfloat16)
        model.half()
        model[0].bfloat16()
        model = model.to("cpu", torch.bfloat16)
        x = torch.randn(5, 4).to(torch.bfloat16)
        assert x.half().dtype == torch.float32 and x.to(dtype=torch.float16).dtype == torch.float32
        assert x.to(torch.bfloat16, copy=True).dtype == torch.float32
        torch.set_default_dtype(torch.bfloat16)
        created = nn.Linear(2, 2)
        out = model(torch.randn(5, 4, dtype=torch.bfloat16))  # made low by a factory: cast at the module
        assert x.to(torch.float64).dtype == torch.float64  # other casts are untouched
    assert {p.dtype for p in model.parameters()} == {created.weight.dtype} == {torch.float32}
    assert x.dtype == torch.float32 and out.dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32
    keys = list(sw.dtypes.switched)
    assert keys[0].startswith("Sequential.to(bfloat16) at test_dtype_switch.py:")
    assert any(k.startswith("Sequential.half(float16)") for k in keys)
    assert any(k.startswith("Linear.bfloat16(bfloat16)") for k in keys)
    assert any(k.startswith("Tensor.to(bfloat16)") for k in keys)
    assert any(k.startswith("torch.set_default") for k in keys)
    assert any(k.startswith("low-precision input of Linear cast to float32") for k in keys)
    assert sw.dtypes.low_weights == set()
    # removed on exit: the conversions work again
    assert nn.Linear(2, 2).to(torch.bfloat16).weight.dtype == torch.bfloat16
    assert torch.ones(1).half().dtype == torch.float16


def test_amp_run_converts_as_written_and_records_it():
    with Switch(mode="amp", seed=0) as sw:
        model = nn.Linear(4, 2).to(torch.bfloat16)
        x = torch.randn(3, 4).to(torch.bfloat16)
    assert model.weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16
    assert sw.dtypes.low_weights == {"cpu:bfloat16"} and sw.dtypes.switched == {}


def test_parameter_created_in_bf16_is_refused_by_name():
    """At its module's forward (named), or at the first step for a parameter used outside a module."""
    with pytest.raises(Refusal, match=r"Linear's parameter of shape \(2, 4\) is still bfloat16 in the FP32 run at "
                                      r"test_dtype_switch.py:\d+ .* created in low precision directly"):
        with Switch(mode="fp32", seed=0, user_dir=HERE):
            model = nn.Linear(4, 2, dtype=torch.bfloat16)
            model(torch.randn(3, 4))
    with pytest.raises(Refusal, match=r"a parameter of shape \(3,\) is still float16"):
        with Switch(mode="fp32", seed=0):
            w = torch.zeros(3, dtype=torch.float16, requires_grad=True)
            opt = torch.optim.SGD([w], lr=0.1)
            (w.float() * 2).sum().backward()
            opt.step()


def test_pure_bf16_script_fp32_run_reports_what_was_switched(tmp_path):
    run = run_script(PURE, ["--steps", "3"], mode="fp32", seed=0, folder=tmp_path)
    assert run.steps == 3 and run.low_weights == [] and run.autocast == []
    assert run.switched == {"Linear.to(bfloat16) at pure_bf16.py:38": 1, "Tensor.to(bfloat16) at pure_bf16.py:43": 3}


def test_created_bf16_script_refusal_names_the_cause(capsys, tmp_path):
    code = main(["compare", "--seeds", "1", "--no-audit", "--out", str(tmp_path), PURE, "--created-bf16"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "is still bfloat16 in the FP32 run" in last and "nn.Linear(..., dtype=torch.bfloat16)" in last


@pytest.mark.slow
def test_from_pretrained_loads_fp32_in_fp32_runs(tmp_path):
    """Hugging Face from_pretrained(dtype=bfloat16) / torch_dtype=: FP32 in FP32 runs, as asked in AMP runs."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    BertModel(config).save_pretrained(tmp_path)
    with Switch(mode="fp32", seed=0, user_dir=HERE) as sw:
        fp32 = BertModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    with Switch(mode="amp", seed=0):
        amp = BertModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in amp.parameters()} == {torch.bfloat16}
    assert any(k.startswith("from_pretrained(dtype=bfloat16) at test_dtype_switch.py:") for k in sw.dtypes.switched)
