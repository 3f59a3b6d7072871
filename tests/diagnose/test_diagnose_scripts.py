"""Every finding code: a planted-defect script that finds it and a clean twin that finds nothing.

The scripts live in ./scripts and run in this interpreter through ``diagnose_script`` (exactly as
``python SCRIPT`` would run them), on the CPU.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from ampkit.diagnose import diagnose_script
from ampkit.diagnose import host_reads as host_reads_mod

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")

# planted script -> (expected code, where must contain)
PLANTED = {
    "overflow_fwd": ("nonfinite-forward", "model.2"),
    "nan_backward": ("nonfinite-backward", "model.1"),
    "clip_before_unscale": ("clip-before-unscale", "clip_before_unscale.py:15"),
    "fp16_params_scaler": ("fp16-params-with-scaler", "fp16_params_scaler.py:7"),
    "fp16_no_scaler": ("fp16-without-scaler", "fp16_no_scaler.py"),
    "scale_collapse": ("scale-collapse", "scale_collapse.py:17"),
    "scaler_not_ckpt": ("scaler-not-checkpointed", "scaler_not_ckpt.py:21"),
    "half_in_autocast": ("half-inside-autocast", "half_in_autocast.py:13"),
    "scaler_bf16": ("scaler-with-bf16", "scaler_bf16.py:15"),
    "overflow_absorbed": ("overflow-absorbed", "model.1"),
    "bce_autocast": ("bce-under-autocast", "bce_autocast.py:14"),
    "lstm_fp16": ("dtype-unsupported", "lstm_fp16.py:11"),
    "script_exit": ("script-exit", "script_exit.py:11"),
}
# Codes produced by a test elsewhere: host reads need an accelerator tensor (test_host_sync_logic_with_device_tensors),
# the device error is raised on purpose (test_device_error_says_how_to_rerun).
ELSEWHERE = {"host-sync-per-step", "script-error"}


def script(name: str) -> str:
    return os.path.join(SCRIPTS, f"{name}.py")


def test_every_diagnose_code_in_the_registry_has_a_planted_script():
    from ampkit.findings import codes

    from test_corpus2 import PLANTED as PLANTED2, expectations  # tests/diagnose is on sys.path (rootdir import)
    from test_corpus3 import PLANTED as PLANTED3, expectations as expectations3

    corpus2 = {code for name in PLANTED2 for code, _ in expectations(name)}  # planted at their lines there
    corpus3 = {code for name in PLANTED3 for code, _ in expectations3(name)}
    assert {code for code, _ in PLANTED.values()} | ELSEWHERE | corpus2 | corpus3 == set(codes("diagnose"))


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_defect_is_found(name):
    code, where = PLANTED[name]
    result = diagnose_script(script(name))
    assert code in result.codes(), result.findings
    finding = next(f for f in result.findings if f.code == code)
    assert where in finding.where
    assert finding.fix and finding.message and finding.step is not None


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_clean_twin_has_no_finding(name):
    result = diagnose_script(script(f"{name}_clean"))
    assert result.findings == (), result.findings
    assert result.error is None


def test_nonfinite_forward_names_the_op_and_fp16_range():
    result = diagnose_script(script("overflow_fwd"))
    (f,) = [f for f in result.findings if f.code == "nonfinite-forward"]
    assert f.step == 0
    assert "aten.addmm" in f.message and "65504" in f.message and "float16" in f.message
    assert "overflow_fwd.py:15" in f.where


def test_nonfinite_backward_names_the_module_and_op():
    result = diagnose_script(script("nan_backward"))
    assert result.codes() == ["nonfinite-backward"]  # later NaNs are consequences, not new findings
    f = result.findings[0]
    assert "Magnitude" in f.message and "aten." in f.message
    assert f.where.endswith("nan_backward.py:8")  # the forward line of the op whose backward failed
    assert "division by zero" in f.message and "SqrtBackward0" in f.message


def test_fp16_params_exception_is_mapped_not_duplicated():
    result = diagnose_script(script("fp16_params_scaler"))
    assert result.codes() == ["fp16-params-with-scaler"]
    assert "Attempting to unscale FP16 gradients" in result.error
    assert "model.0.weight" in result.findings[0].message


def test_step_budget_stops_the_script():
    result = diagnose_script(script("scale_collapse_clean"), steps=3)
    assert result.steps == 3
    assert "3 optimizer steps" in result.stopped


def test_script_runs_like_python_script_and_state_is_restored():
    argv, path0 = sys.argv[:], sys.path[0]
    result = diagnose_script(script("argv_probe"), ["--lr", "0.1", "pos"])
    assert result.stopped == "finished" and result.findings == ()
    assert sys.argv == argv and sys.path[0] == path0
    bad = diagnose_script(script("argv_probe"), ["other"])
    assert bad.stopped == "exit 1" and bad.codes() == ["script-exit"]


def test_instrumentation_is_removed_after_a_run():
    before = {n: n in torch.Tensor.__dict__ for n in ("item", "half", "to", "__bool__")}
    diagnose_script(script("fp16_params_scaler"))  # ends with an exception
    assert {n: n in torch.Tensor.__dict__ for n in before} == before
    assert torch.save is torch.serialization.save and torch.save.__module__ == "torch.serialization"
    assert torch.amp.GradScaler.scale.__qualname__ == "GradScaler.scale"
    assert torch.nn.utils.clip_grad_norm_.__module__ == "torch.nn.utils.clip_grad"
    import torch.nn.modules.module as mm

    assert not mm._global_forward_hooks and not mm._global_forward_pre_hooks


def test_device_error_says_how_to_rerun():
    result = diagnose_script(script("script_error"))
    (f,) = result.findings
    assert f.code == "script-error" and "script_error.py:9" in f.where
    assert "CUDA_LAUNCH_BLOCKING=1" in f.fix and "TORCH_SHOW_CPP_STACKTRACES=1" in f.fix
    musa = diagnose_script(script("script_error"), device="musa")
    assert "MUSA_LAUNCH_BLOCKING=1" in musa.findings[0].fix


def test_host_sync_is_not_reported_on_the_cpu():
    assert diagnose_script(script("host_sync")).findings == ()


def test_host_sync_logic_with_device_tensors(monkeypatch):
    # On the CPU a read is no device sync; pretend every tensor lives on an accelerator to test the
    # bookkeeping (the real thing runs in test_host_sync_on_gpu).
    monkeypatch.setattr(host_reads_mod, "_is_accelerator_tensor", lambda t: True)
    result = diagnose_script(script("host_sync"))
    wheres = sorted(f.where for f in result.findings if f.code == "host-sync-per-step")
    assert [w.rsplit(":", 1)[1] for w in wheres] == ["18", "23"], result.findings
    assert diagnose_script(script("host_sync_clean")).findings == ()


@pytest.mark.gpu
def test_host_sync_on_gpu():
    dev = "cuda" if torch.cuda.is_available() else "musa"
    result = diagnose_script(script("host_sync"), [dev])
    lines = sorted(f.where.rsplit(":", 1)[1] for f in result.findings if f.code == "host-sync-per-step")
    assert lines == ["18", "23"], result.findings
    assert diagnose_script(script("host_sync_clean"), [dev]).findings == ()


def test_other_manual_casts_inside_autocast(tmp_path):
    p = tmp_path / "casts.py"
    p.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "x = torch.randn(2, 4)\n"
        "with torch.autocast('cpu', dtype=torch.float16):\n"
        "    y = m(x.to(torch.float16))\n"
        "    m.half()\n"
        "z = x.to(torch.float16)  # outside autocast: fine\n")
    result = diagnose_script(str(p))
    assert sorted(f.where.rsplit(":", 1)[1] for f in result.findings) == ["5", "6"]
    assert {f.code for f in result.findings} == {"half-inside-autocast"}


def test_missing_script_and_bad_steps_are_usage_errors(tmp_path):
    from ampkit.errors import UsageError

    with pytest.raises(UsageError, match="script not found"):
        diagnose_script(str(tmp_path / "nope.py"))
    with pytest.raises(UsageError, match="steps"):
        diagnose_script(script("argv_probe"), steps=0)


def test_scale_that_keeps_falling_is_found_before_it_reaches_one(tmp_path):
    # One healthy update, then a backoff on every update: the scale stays far above 1 but keeps falling.
    p = tmp_path / "falling.py"
    p.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu')\n"
        "for step in range(8):\n"
        "    opt.zero_grad()\n"
        "    scaler.scale(m(torch.randn(2, 4)).sum()).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update(None if step == 0 else scaler.get_scale() / 2)\n")
    result = diagnose_script(str(p))
    (f,) = result.findings
    assert f.code == "scale-collapse" and "backoffs in the last" in f.message and "falling.py:9" in f.where
