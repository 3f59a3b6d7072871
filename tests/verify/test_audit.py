"""ampkit.audit: per-op dtypes under autocast, module attribution, matmul FLOP share, surprises."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ampkit
from ampkit.verify.audit import OUTSIDE, audit_task


def _cpu_list_says(fn, dtype=torch.bfloat16) -> str:
    """What the installed torch's CPU autocast lists do with ``fn`` of a low-precision input."""
    x = torch.randn(4, 8).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        out = fn(x)
    return "promoted" if out.dtype == torch.float32 else "low"


def test_linear_low_softmax_as_the_cpu_lists_say():
    model = nn.Sequential(nn.Linear(16, 32), nn.Softmax(-1))
    r = ampkit.audit(model, torch.randn(8, 16), precision="bf16")
    assert r.module_category("0") == "low"
    assert r.op_categories("addmm") == {"low"}
    # torch 2.13's CPU autocast keeps softmax out of its FP32 list (it follows its BF16 input); CUDA's
    # list promotes it. The audit must report what actually ran, whichever list is installed.
    expected = _cpu_list_says(lambda x: torch.softmax(x, -1))
    assert r.module_category("1") == expected
    assert r.output_dtype == ("bfloat16" if expected == "low" else "float32")
    assert r.matmul_share == 1.0 and r.forward_matmul_share == 1.0
    # forward addmm + the weight-gradient mm (the input needs no gradient): 2 * M * K * N each
    assert r.forward_matmul_flops == 2 * 8 * 16 * 32 and r.matmul_flops == 2 * r.forward_matmul_flops
    assert r.surprises == ()


def test_cross_entropy_is_promoted_to_fp32_under_cpu_lists():
    assert _cpu_list_says(lambda x: F.cross_entropy(x, torch.zeros(4, dtype=torch.long))) == "promoted"
    model = nn.Linear(16, 4)
    target = torch.randint(0, 4, (8,))
    r = ampkit.audit(model, torch.randn(8, 16), precision="bf16", loss_fn=lambda out: F.cross_entropy(out, target))
    assert r.module_category("(Linear)") == "low"
    assert r.op_categories("_log_softmax") == {"promoted"}
    assert r.op_categories("nll_loss_forward") == {"promoted"}
    loss_row = next(m for m in r.by_module() if m["module"] == OUTSIDE)
    assert loss_row["verdict"] == "promoted"


class _Surprising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(8, 8)
        self.disabled = nn.Linear(8, 8)
        self.wide = nn.Linear(8, 8).double()

    def forward(self, x):
        x = self.ok(x)
        with torch.autocast("cpu", enabled=False):
            x = self.disabled(x.float())
        return self.wide(x.double()).float()


def test_surprises_name_the_module_and_the_cause():
    r = ampkit.audit(_Surprising(), torch.randn(4, 8), precision="bf16")
    by = {s.module: s for s in r.surprises}
    assert set(by) == {"disabled", "wide"}
    assert by["disabled"].kind == "fp32-matmul-in-autocast" and "enabled=False" in by["disabled"].message
    assert "Linear 'disabled'" in by["disabled"].message
    assert "FP64" in by["wide"].message and by["wide"].fix
    assert r.module_category("ok") == "low"
    assert r.module_category("wide") == "fp64"
    assert 0 < r.matmul_share < 1


def test_manual_half_is_a_surprise():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).half()
    r = ampkit.audit(model, torch.randn(4, 8).half(), precision="bf16")
    kinds = {s.kind for s in r.surprises}
    assert "low-precision-params" in kinds
    # autocast re-casts the FP16 weights to BF16 for the matmul, so the op itself is "low"; the damage is
    # the FP16 master weights, which the parameter check names
    assert r.module_category("0") == "low"
    assert any(s.module == "0" and "float16 parameter" in s.message for s in r.surprises)


def test_model_is_left_as_it_was():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ampkit.audit(model, torch.randn(4, 8), precision="bf16")
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert type(model).forward is nn.Sequential.forward and "forward" not in model.__dict__


def test_fp32_precision_runs_everything_in_fp32():
    r = ampkit.audit(nn.Linear(8, 8), torch.randn(4, 8), precision="fp32")
    assert r.matmul_share == 0.0 and r.output_dtype == "float32"
    assert {row["verdict"] for row in r.by_module()} == {"fp32"}
    assert r.surprises == ()


def test_dict_inputs_and_to_dict():
    class KW(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, *, x):
            return {"y": self.fc(x)}

    r = ampkit.audit(KW(), {"x": torch.randn(2, 4)}, precision="bf16")
    d = r.to_dict()
    assert d["output_dtype"] == "bfloat16" and d["ops"] and d["by_module"][0]["module"] == "fc"


def test_audit_task_on_digits():
    task = ampkit.load_task("digits", seed=0)
    r = audit_task(task, precision="bf16", device="cpu")
    assert r.module_category("conv") == "low"
    assert r.module_category("fc1") == "low" and r.module_category("fc2") == "low"
    assert r.matmul_share == 1.0 and r.output_dtype == "bfloat16"
    assert r.op_categories("convolution_backward", phase="backward") == {"low"}


def test_declared_fp32_regions_are_declared_not_surprises():
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    plain = ampkit.audit(model, torch.randn(4, 8), precision="bf16")
    assert plain.surprises == () and plain.declared == () and plain.module_category("2") == "low"
    r = ampkit.audit(model, torch.randn(4, 8), precision="bf16", fp32_modules=["2", "preset:norm"])
    assert r.surprises == ()  # the FP32 matmul of '2' was asked for
    declared = {d["module"]: d for d in r.declared}
    assert set(declared) == {"1", "2"}
    # FP32 from the BF16 values of '0' before it: "promoted" (FP32 compute of low-precision-derived data)
    assert declared["2"]["ran_in"] == "promoted" and declared["2"]["matmul_flops"] > 0
    assert "declared FP32 region" in declared["2"]["message"]
    assert r.module_category("2") == "promoted" and r.module_category("0") == "low"
    assert r.summary()["declared"][0]["module"] == "1"
    # the regions' hooks are gone afterwards: the next pass is low precision again
    assert ampkit.audit(model, torch.randn(4, 8), precision="bf16").module_category("2") == "low"


def test_fp32_inside_an_undeclared_module_is_still_a_surprise():
    r = ampkit.audit(_Surprising(), torch.randn(4, 8), precision="bf16", fp32_modules=["ok"])
    assert {s.module for s in r.surprises} == {"disabled", "wide"}  # only 'ok' was declared
    assert [d["module"] for d in r.declared] == ["ok"] and r.declared[0]["ran_in"] == "fp32"


def test_audit_cli_fp32_modules(capsys):
    from ampkit.cli import main
    from task_specs import TOY

    assert main(["audit", "--task", TOY, "--precision", "bf16", "--fp32-modules", "3"]) == 0
    text = capsys.readouterr().out
    assert "'3' is a declared FP32 region" in text and "surprise " not in text and "no surprises" in text
    assert main(["audit", "--task", TOY, "--precision", "bf16", "--fp32-modules", "nope"]) == 2
    err = capsys.readouterr().err
    assert "matches no module" in err and len(err.strip().splitlines()) == 1
