"""Issue 15, diagnose half: what fell short on real-world scripts, one test each."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from ampkit.cli import main
from ampkit.diagnose import diagnose_script
from ampkit.diagnose.fixes import clip_fix

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


RAISES = (
    "import torch\n"
    "import torch.nn as nn\n"
    "class Bad(nn.Module):\n"
    "    def forward(self, x):\n"
    "        return x @ torch.ones(3, 3)\n"
    "model = nn.Sequential(nn.Linear(4, 4), Bad())\n"
    "model(torch.randn(2, 4))\n")


def test_forward_that_raises_shows_the_script_traceback_and_no_hook_warning(tmp_path, capsys):
    path = write(tmp_path, "raises.py", RAISES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["diagnose", path]) == 1
    assert not [w for w in caught if "always_call" in str(w.message)], [str(w.message) for w in caught]
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{path}", line 7, in <module>' in err and f'File "{path}", line 5, in forward' in err
    assert "runpy" not in err and "ampkit" not in err
    assert err.rstrip().endswith("mat1 and mat2 shapes cannot be multiplied (2x4 and 3x3)")


def test_where_has_one_form_relative_inside_the_cwd(tmp_path, monkeypatch):
    bad = write(tmp_path, "raises.py", RAISES)
    over = os.path.join(SCRIPTS, "overflow_fwd.py")
    monkeypatch.chdir(tmp_path)
    assert diagnose_script(bad).findings[0].where == "raises.py:5"
    monkeypatch.chdir(SCRIPTS)
    assert diagnose_script(over).findings[0].where.startswith("model.2 · overflow_fwd.py:15")
    monkeypatch.chdir(tmp_path)  # outside the folder: absolute, for both kinds
    assert diagnose_script(over).findings[0].where.startswith(f"model.2 · {over}:15")
    other = tmp_path / "sub"
    other.mkdir()
    monkeypatch.chdir(other)
    assert diagnose_script(bad).findings[0].where == f"{bad}:5"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is about CUDA being absent")
def test_warnings_from_wrapped_torch_calls_name_the_users_line(tmp_path):
    path = write(tmp_path, "warn.py", "import torch\n"
                 "a = torch.amp.GradScaler('cuda')\n"
                 "b = torch.amp.GradScaler('cuda')\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        diagnose_script(path)
    hits = [(os.path.basename(w.filename), w.lineno) for w in caught if "CUDA is not available" in str(w.message)]
    assert hits == [("warn.py", 2), ("warn.py", 3)]  # not scaler_checks.py, and not merged into one


def test_sys_exit_is_reported_plainly(tmp_path):
    result = diagnose_script(os.path.join(SCRIPTS, "script_exit.py"))
    (f,) = result.findings
    assert f.code == "script-exit" and result.stopped == "exit 3" and result.steps == 1
    assert "sys.exit(3)" in f.message and "exit status 3" in f.message
    assert "C++" not in f.fix and "STACKTRACES" not in f.fix
    assert diagnose_script(os.path.join(SCRIPTS, "script_exit.py"), ["cfg.yaml"]).findings == ()


def test_piped_output_is_not_cut_at_80_columns(capsys):
    main(["diagnose", os.path.join(SCRIPTS, "clip_before_unscale.py")])
    out = capsys.readouterr().out
    fix = next(line for line in out.splitlines() if line.strip().startswith("fix:"))
    assert fix.strip() == "fix:   " + clip_fix("clip_grad_norm_")
    where = next(line for line in out.splitlines() if line.strip().startswith("where:"))
    assert where.rstrip().endswith("clip_before_unscale.py:15")


def test_fp16_range_says_the_steps_it_took(capsys):
    main(["diagnose", "--fp16-range", "--steps", "3", os.path.join(SCRIPTS, "overflow_fwd_clean.py")])
    out = capsys.readouterr().out
    assert "FP32 run of 3 step(s)" in out


def test_nonfinite_backward_in_bf16_does_not_suggest_unscale(tmp_path):
    src = open(os.path.join(SCRIPTS, "nan_backward.py")).read()
    src = src.replace("    loss = nn.functional.mse_loss(model(x), y)",
                      "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                      "        loss = nn.functional.mse_loss(model(x).float(), y)")
    result = diagnose_script(write(tmp_path, "nan_bf16.py", src))
    (f,) = result.findings
    assert f.code == "nonfinite-backward" and "unscale_" not in f.fix and "scaler" not in f.fix.lower()


def test_clip_fix_names_the_function_called(tmp_path):
    src = open(os.path.join(SCRIPTS, "clip_before_unscale.py")).read()
    src = src.replace("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
                      "torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)")
    (f,) = diagnose_script(write(tmp_path, "clip_value.py", src)).findings
    assert f.code == "clip-before-unscale"
    assert "clip_grad_value_" in f.fix and "clip_grad_norm_" not in f.fix and "`clip_grad_value_`" in f.message


def test_fp16_lstm_on_the_cpu_gets_the_fix_this_cpu_runs():
    from _cpu import lstm_runs_in  # tests/diagnose is on sys.path (rootdir import)

    (f,) = diagnose_script(os.path.join(SCRIPTS, "lstm_fp16.py")).findings
    assert f.code == "dtype-unsupported" and "fix the error shown" not in f.fix
    if lstm_runs_in(torch.bfloat16):  # AVX-512: oneDNN has a BF16 LSTM
        assert f.fix.startswith("use BF16 here") and "dtype=torch.bfloat16" in f.fix
    else:  # AVX2 only: BF16 would fail the same way, so the fix is the LSTM in FP32
        assert f.fix.startswith("run the LSTM in FP32") and "enabled=False" in f.fix and "BF16 here" not in f.fix


@pytest.mark.parametrize("bf16_runs", [True, False])
def test_dtype_fix_names_bf16_only_where_the_failing_rnn_runs_in_it(monkeypatch, bf16_runs):
    # both branches on any CPU: the probe's answer is replaced
    import ampkit.diagnose.runner as runner

    monkeypatch.setattr(runner, "_bf16_rnn_runs", lambda kind, dev: bf16_runs)
    inst = type("Inst", (), {"devices_seen": {"cpu"}})()
    line = "RuntimeError: could not create a primitive descriptor for the GRU forward propagation primitive"
    fix = runner._dtype_fix({torch.float16}, inst, line)
    assert fix.startswith("use BF16 here") if bf16_runs else fix.startswith("run the GRU in FP32")
    # an op that is not recurrent: the device's BF16 support alone decides, no probe
    monkeypatch.setattr(runner, "_bf16_rnn_runs", lambda kind, dev: pytest.fail("probed a non-recurrent op"))
    assert runner._dtype_fix({torch.float16}, inst, '"addmm_impl_cpu_" not implemented for \'Half\'').startswith(
        "use BF16 here")
