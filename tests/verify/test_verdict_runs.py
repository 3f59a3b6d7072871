"""Issue 41: `compare --seeds auto` on real runs, refusals after the first run, the steady-state step of a script,
and `audit SCRIPT` on its first autocast step (real subprocesses of the scripts in tests/verify/scripts/)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ampkit
from ampkit.cli import main
from ampkit.diagnose.step_timer import StepTimer, steady_ms
from ampkit.errors import UsageError
from ampkit.verify.script_compare import audit_script, compare_script

SCRIPTS = Path(__file__).parent / "scripts"
PHASES = str(SCRIPTS / "fp32_phase_first.py")
TOY = str(Path(__file__).parents[1] / "toy_task.py") + ":make_task"


# ---------------------------------------------------------------------------------------- refuse early
def test_a_script_without_autocast_is_refused_after_its_first_run(tmp_path):
    with pytest.raises(UsageError, match="enables no autocast region"):
        compare_script(PHASES, ["--no-amp"], seeds=3, out=tmp_path, run_audit=False)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["amp-seed0"]  # one run, not 2 x 3


def test_an_unmatched_metric_is_refused_after_the_first_run(tmp_path):
    with pytest.raises(UsageError, match="matched nothing in the output of the AMP run of seed 0"):
        compare_script(PHASES, [], seeds=3, out=tmp_path, run_audit=False, metric=r"val acc ([0-9.]+)")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["amp-seed0"]


# ---------------------------------------------------------------------------------------- speed of a script
def test_script_speed_is_the_steady_state_step_and_progress_says_loss(tmp_path):
    events = []
    r = compare_script(PHASES, ["--fp32-steps", "0", "--amp-steps", "30"], seeds=1, run_audit=False,
                       progress=events.append)
    assert r.throughput["unit"] == "steps/s (steady state)"
    assert r.throughput["step_ms"]["fp32"] > 0 and r.throughput["step_ms"]["amp"] > 0
    note = next(n for n in r.notes if n.startswith("steady-state step: "))
    assert " ms FP32 vs " in note and " ms BF16, speed-up " in note and "one seed: no spread" in note
    assert r.memory["fp32"] is None  # the CPU: torch tracks no peak
    ends = [e for e in events if e["event"] == "run_end"]
    assert [e["precision"] for e in ends] == ["amp", "fp32"] and all(e["metric"] == "loss" for e in ends)


def test_step_timer_marks_each_step_and_reads_once():
    class _Switch:
        losses = []

    timer = StepTimer()
    timer.switch = _Switch()
    for step in range(1, 6):
        time.sleep(0.002)
        timer.on_step(step)
    got = timer.result()
    assert got["device"] == "cpu" and len(got["step_ms"]) == 4 and all(v >= 1.5 for v in got["step_ms"])
    assert steady_ms([1000.0, 900.0, 5.0, 5.0, 7.0, 400.0]) == 6.0  # warm-up left out, one outlier does not move it
    assert steady_ms([1.0, 2.0, 3.0]) is None  # too few steps for a steady state


# ---------------------------------------------------------------------------------------- audit SCRIPT
def test_audit_records_the_first_step_with_autocast():
    a = audit_script(PHASES)  # three FP32 steps come first, as in the PyTorch AMP recipe
    assert a.summary()["matmul_share"] == 1.0 and a.dtype == "bfloat16"
    with pytest.raises(UsageError, match="enables no autocast region"):
        audit_script(PHASES, ["--no-amp"])


def test_fp32_matmuls_of_torchs_attention_kernel_are_not_surprises():
    a = audit_script(str(SCRIPTS / "sdpa_dropout.py"))
    ruled = [r for r in a.ops if r.by_rule == "scaled_dot_product_attention"]
    assert [r for r in ruled if r.matmul and r.out_dtypes == ("float32",)]  # torch upcast them itself
    assert not a.surprises, a.surprises


# ---------------------------------------------------------------------------------------- --seeds auto
def test_auto_seeds_on_a_task_stop_when_decided():
    r = ampkit.compare(TOY, precision="bf16", seeds="auto", max_seeds=5, steps=12, log_every=3, run_audit=False)
    seq = r.effects["sequential"]
    assert r.verdict == "pass" and seq["seeds_used"] == len(r.seeds) and 3 <= len(r.seeds) <= 5
    assert seq["stopped"] == f"decided (pass) after {len(r.seeds)} seeds" and seq["max_seeds"] == 5
    assert any(n.startswith(f"--seeds auto: {len(r.seeds)} seeds") for n in r.notes)
    assert all(e["alpha_pass"] == seq["nominal_pass"] for e in r.effects["endpoints"])


@pytest.mark.parametrize("argv,expect", [
    (["--seeds", "3", "--max-seeds", "6"], "--max-seeds bounds --seeds auto"),
    (["--seeds", "auto", "--max-seeds", "2"], "--max-seeds must be an integer >= 3"),
    (["--seeds", "auto", "--continue"], "--continue adds seeds up to a fixed count"),
])
def test_auto_seeds_usage_errors(argv, expect, capsys, tmp_path):
    assert main(["compare", "--out", str(tmp_path / "c"), *argv]) == 2
    assert expect in capsys.readouterr().err


def test_seeds_takes_a_number_or_auto(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--seeds", "many"])
    assert exc.value.code == 2 and "takes a number of seeds or 'auto'" in capsys.readouterr().err
