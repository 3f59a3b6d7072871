"""FP16 range analysis: the Python API, and the script mode validated against nonfinite-forward."""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from ampkit.diagnose import diagnose_script, fp16_range_report, fp16_range_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _mlp(big: float = 1.0) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    with torch.no_grad():
        model[2].weight.mul_(big)
    return model


def _batches(n=3, scale=4.0):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 16, generator=g) * scale, torch.randn(32, 4, generator=g)) for _ in range(n)]


def test_api_names_the_overflowing_module_and_leaves_the_model_alone():
    model = _mlp(1e5)
    before = [p.detach().clone() for p in model.parameters()]
    report = fp16_range_report(model, _batches(), nn.functional.mse_loss)
    assert report.keep_fp32 == ("model.2",)
    assert "model.2" in report.overflow and "model.0" not in report.overflow
    assert report.steps == 3
    row = next(r for r in report.modules if r.name == "model.2")
    assert row.act_max > 65504 and row.input_max < 65504 and row.type == "Linear"
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_api_predicts_underflow_and_a_scale_that_fixes_it():
    model = _mlp()
    report = fp16_range_report(model, _batches(scale=1.0), lambda out, y: nn.functional.mse_loss(out, y) * 1e-5)
    assert report.keep_fp32 == () and report.overflow == ()
    assert "model.0" in report.underflow
    row = next(r for r in report.modules if r.name == "model.0")
    assert row.grad_zero_share_fp16 > 0.9 and row.grad_subnormal_share_fp16 > 0.9
    assert row.grad_zero_share_scaled < 0.01
    assert report.recommended_scale == 2.0 ** 16


def test_api_recommends_a_smaller_scale_for_large_gradients():
    model = _mlp()
    report = fp16_range_report(model, _batches(1), lambda out, y: nn.functional.mse_loss(out, y) * 1e3)
    gmax = max(r.grad_max for r in report.modules if r.grad_max is not None)
    assert report.recommended_scale * gmax <= 65504 / 2
    assert report.recommended_scale * gmax * 4 > 65504 / 2  # the largest power of two that fits, within 2x
    assert not any(r.overflow_backward_scaled for r in report.modules)


def test_script_mode_agrees_with_nonfinite_forward():
    # Validation of the prediction: the module the FP32 range run names is the one that overflows in FP16.
    report, error = fp16_range_script(os.path.join(SCRIPTS, "overflow_fwd.py"), steps=3)
    assert error is None
    result = diagnose_script(os.path.join(SCRIPTS, "overflow_fwd.py"))
    (f,) = [f for f in result.findings if f.code == "nonfinite-forward"]
    assert report.keep_fp32 == (f.where.split(" ")[0],) == ("model.2",)


def test_script_mode_runs_with_autocast_and_scaler_off():
    report, error = fp16_range_script(os.path.join(SCRIPTS, "overflow_fwd_clean.py"), steps=2)
    assert error is None and report.keep_fp32 == () and report.overflow == ()
    assert report.steps == 2  # two steps taken; the third, begun and stopped, is not counted or recorded
    # FP32 run: the tiny FP16 values would have been zero; in FP32 they are measured, not zero
    assert all(r.grad_max is None or r.grad_max > 0 for r in report.modules)


CORPUS2 = os.path.join(os.path.dirname(__file__), "corpus2")


def test_overflow_inside_a_module_exits_1_and_matches_the_plain_run(capsys, monkeypatch):
    from ampkit.cli import main

    monkeypatch.chdir(CORPUS2)
    assert main(["diagnose", "--fp16-range", "softmax_sum_overflow.py"]) == 1
    out = capsys.readouterr().out
    assert "op overflow:" in out and "aten.sum" in out and "op inside overflows" in out
    report, error = fp16_range_script("softmax_sum_overflow.py")
    assert error is None and report.overflow == () and report.keep_fp32 == ("model.head",)
    assert [(o.module, o.op) for o in report.op_overflow] == [("model.head", "aten.sum")]
    (plain,) = diagnose_script("softmax_sum_overflow.py").findings
    assert plain.where.startswith("model.head ")  # the module the plain run reports


def test_a_loss_on_float_logits_is_not_kept_in_fp32(monkeypatch):
    from ampkit.cli import main

    monkeypatch.chdir(CORPUS2)
    report, error = fp16_range_script("range_loss_float.py")
    assert error is None and report.keep_fp32 == () and report.overflow == () and report.op_overflow == ()
    assert any("criterion runs on inputs the script casts with `.float()`" in n for n in report.notes)
    assert main(["diagnose", "--fp16-range", "range_loss_float.py"]) == 0


class _Gain(nn.Module):
    """A Linear whose output is multiplied by 1e6: by a Python number (FP16 under autocast) or by an FP32
    buffer (type promotion makes the product FP32 under autocast)."""

    def __init__(self, promoted: bool):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.promoted = promoted
        self.register_buffer("gain", torch.full((8,), 1e6))

    def forward(self, x):
        y = self.fc(x)
        z = y * self.gain if self.promoted else y * 1e6
        return z.sum(-1, keepdim=True) * 1e-6


def test_api_follows_autocast_casting_rules_for_ops():
    # Only a value the AMP run holds in FP16 can overflow it: the same multiply is named when its product is
    # FP16 and not when autocast's type promotion makes it FP32 (issue 45).
    reports = {}
    for promoted in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(_Gain(promoted), nn.Linear(1, 2))
        reports[promoted] = fp16_range_report(model, [(torch.randn(4, 8), torch.randn(4, 2))], nn.functional.mse_loss)
    assert reports[False].keep_fp32 == ("model.0",) and any(o.op == "aten.mul" for o in reports[False].op_overflow)
    assert reports[True].keep_fp32 == () and reports[True].op_overflow == ()


def test_script_mode_does_not_name_a_multiply_autocast_runs_in_fp32():
    # `scores.float() * 1e5` is FP32 under autocast: its 1e5 is no FP16 overflow (plain diagnose agrees).
    path = os.path.join(SCRIPTS, "range_fp32_multiply.py")
    report, error = fp16_range_script(path, steps=2)
    assert error is None and report.keep_fp32 == () and report.op_overflow == () and report.overflow == ()
    assert diagnose_script(path).findings == ()
