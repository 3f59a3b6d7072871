"""`ampkit compare SCRIPT` / `ampkit audit SCRIPT` on real, unmodified scripts (tests/verify/scripts/).

Every run is a real subprocess of the real script with the real library (torch, HF Trainer, Lightning Fabric,
Accelerate) on the CPU; each comparison runs once per session (3 seeds: two can only be inconclusive at the default tolerance; a few steps)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.diagnose.script_run import run_script
from ampkit.verify.script_compare import audit_script, compare_script, higher_is_better, window_curve

SCRIPTS = Path(__file__).parent / "scripts"


def _script(name: str) -> str:
    return str(SCRIPTS / name)


@pytest.fixture(scope="session")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    return compare_script(_script("plain_loop.py"), ["--epochs", "1"], seeds=3, metric=r"test accuracy ([0-9.]+)",
                          out=out), out


@pytest.mark.slow
def test_plain_loop_passes_and_says_it_came_from_the_script(plain):
    result, out = plain
    assert result.verdict == "pass", result.reasons
    assert result.precision == "bf16" and result.steps == 30  # one epoch of 1500 samples in batches of 50
    assert result.final_metric["name"] == "test accuracy" and result.final_metric["higher_is_better"]
    data = json.loads((out / "compare.json").read_text())
    assert data["source"]["kind"] == "script" and data["source"]["args"] == ["--epochs", "1"]
    assert set(data["source"]["run_wall_s"]) == {f"{m}-seed{s}" for m in ("fp32", "amp") for s in range(3)}
    assert 'id="source"' in (out / "report.html").read_text()
    assert result.audit["matmul_share"] == 1.0  # the AMP audit of its first step: every matmul in BF16


@pytest.mark.slow
def test_steps_and_seeds(tmp_path):
    """--steps stops the run; run k of FP32 and AMP start alike (ampkit's seed replaces the script's own
    torch.manual_seed(42)); another k starts elsewhere."""
    runs = {(m, k): run_script(_script("plain_loop.py"), [], mode=m, seed=k, folder=tmp_path / f"{m}{k}", steps=3)
            for m, k in (("fp32", 0), ("amp", 0), ("fp32", 1))}
    assert all(r.steps == 3 and len(r.losses) == 3 for r in runs.values())
    assert abs(runs["fp32", 0].losses[0] - runs["amp", 0].losses[0]) < 0.02
    assert runs["fp32", 0].losses[0] != runs["fp32", 1].losses[0]
    assert runs["fp32", 0].autocast == [] and runs["amp", 0].autocast == ["cpu:bfloat16"]


@pytest.mark.slow
@pytest.mark.parametrize("script,args", [("accelerate_loop.py", []), ("fabric_loop.py", []),
                                         ("hf_trainer.py", None)])
def test_library_scripts_pass(script, args, tmp_path):
    args = [str(tmp_path / "hf")] if args is None else args
    result = compare_script(_script(script), args, seeds=3, steps=12, run_audit=False)
    assert result.verdict == "pass", result.reasons
    assert result.precision == "bf16" and result.steps == 12
    assert all(len(c) == 12 for c in result.curves["fp32"].values())


@pytest.mark.slow
def test_fp16_defect_fails():
    result = compare_script(_script("fp16_overflow.py"), seeds=2, steps=10, run_audit=False)
    assert result.verdict == "fail"
    assert result.precision == "fp16"
    assert sum(result.skipped["amp"].values()) == 20 and sum(result.skipped["fp32"].values()) == 0
    assert any("skipped" in r for r in result.reasons)
    assert result.scale_trace is not None


@pytest.mark.slow
@pytest.mark.parametrize("script,args", [("plain_loop.py", []), ("fabric_loop.py", [])])
def test_fp32_runs_contain_no_low_precision_op(script, args):
    """The FP32 side really is FP32: every op of its first step, recorded by the audit machinery."""
    fp32 = audit_script(_script(script), args, mode="fp32")
    amp = audit_script(_script(script), args, mode="amp")
    assert fp32.ops and not [r for r in fp32.ops if r.category == "low" or set(r.out_dtypes) & {"bfloat16", "float16"}]
    assert [r for r in amp.ops if r.category == "low"]


@pytest.mark.parametrize("argv,expect", [
    (["distributed.py"], "starts torch.distributed"),
    (["no_step.py"], "without an optimizer step"),
    (["crash.py"], "ValueError: data file train.csv is missing"),
    (["missing.py"], "script not found"),
])
def test_refusals_are_one_line(argv, expect, capsys, tmp_path):
    code = main(["compare", "--seeds", "1", "--out", str(tmp_path), _script(argv[0]), *argv[1:]])
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("ampkit compare: error: ") and expect in last and "Traceback" not in err, err


def test_torchrun_launch_refused(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["compare", _script("plain_loop.py")]) == 2
    assert "launched for several (WORLD_SIZE=2" in capsys.readouterr().err


def test_metric_needs_a_group_and_a_match(capsys, tmp_path):
    assert main(["compare", "--metric", "accuracy", _script("plain_loop.py")]) == 2
    assert "needs a group" in capsys.readouterr().err
    assert main(["compare", "--json", "--seeds", "1", "--steps", "2", "--out", str(tmp_path), "--metric",
                 "test accuracy ([0-9.]+)", _script("plain_loop.py")]) == 2
    assert "--steps stopped it" in capsys.readouterr().err


def test_audit_script_cli(capsys):
    assert main(["audit", "--json", _script("plain_loop.py"), "--epochs", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["script"].endswith("plain_loop.py") and data["dtype"] == "bfloat16"
    assert {o["phase"] for o in data["ops"]} == {"forward", "backward"}


def test_helpers():
    assert higher_is_better("test accuracy ([0-9.]+)", None) and not higher_is_better("eval loss ([0-9.]+)", None)
    assert not higher_is_better("test accuracy ([0-9.]+)", "min")
    assert window_curve([1.0, 3.0, float("nan"), None, 2.0], 2) == [[2, 2.0], [4, None], [5, 2.0]]
