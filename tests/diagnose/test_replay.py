"""``ampkit diagnose --replay RUN_DIR``: a run of ``ampkit train`` that goes bad late keeps its last good
checkpoint, and the replay names the op, the module, the line and the cause.

The planted failures are in tests/late_overflow_task.py: from micro-batch ``shift_at`` on, ``mix`` overflows
FP16 (FP32 stays finite), or the data holds a NaN. Each run is trained once per module with the real CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from ampkit.checkpoint import load_checkpoint
from ampkit.cli import main
from ampkit.diagnose.replay import replay_run
from ampkit.diagnose.tracking import short_path
from ampkit.errors import UsageError

TASK_FILE = Path(__file__).resolve().parents[1] / "late_overflow_task.py"
TASK = f"{TASK_FILE}:make_task"


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(TASK_FILE.read_text().splitlines(), 1) if marker in text)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _train(out: Path, *extra: str) -> tuple[int, str]:
    rc, _, err = _cli("train", "--task", TASK, "--precision", "fp16", "--ckpt-every", "5", "--keep", "2",
                      "--steps", "100", "--out", str(out), *extra)
    return rc, err


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def overflow_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("late") / "run"
    rc, err = _train(out)  # shift_at=30: micro-batch 30 is optimizer step 31
    return out, rc, err


def test_halt_keeps_the_checkpoint_from_before_the_streak(overflow_run):
    out, rc, err = overflow_run
    ckpts = out / "checkpoints"
    steps = sorted(int(p.name[5:13]) for p in ckpts.glob("step-*.pt"))
    # --keep 2 rotated the streak's checkpoints (70, 75); step 30, the last one before step 31, stayed.
    assert steps == [30, 70, 75], steps
    assert json.loads((ckpts / "last-good.json").read_text()) == {"step": 30, "name": "step-00000030.pt"}
    assert int(load_checkpoint(ckpts / "step-00000030.pt")["amp"]["counters"][1]) == 0
    assert int(load_checkpoint(ckpts / "step-00000075.pt")["amp"]["counters"][1]) == 45
    lines = err.strip().splitlines()
    assert rc == 1 and "Traceback" not in err
    assert "training stopped at step 80" in lines[-1]
    assert f"the last good checkpoint is {ckpts / 'step-00000030.pt'} (step 30" in lines[-1]
    assert f"`ampkit diagnose --replay {out}`" in lines[-1]
    halt = json.loads((out / "run.json").read_text())["halt"]
    assert halt["step"] == 80 and halt["first_bad_step"] == 31 and halt["last_good_step"] == 30


def test_run_record(overflow_run):
    out, _, _ = overflow_run
    rec = json.loads((out / "run.json").read_text())
    assert rec["format"] == "ampkit-run" and rec["task"] == TASK and rec["precision"] == "fp16"
    assert rec["seed"] == 0 and rec["steps"] == 100 and rec["ckpt_every"] == 5 and rec["keep"] == 2
    assert rec["engine"]["max_consecutive_skips"] == 50 and rec["fp32_modules"] == []
    assert rec["versions"]["torch"] == torch.__version__ and rec["replayable"] is True


def test_replay_names_the_op_and_finds_precision(overflow_run):
    out, _, _ = overflow_run
    before = _hashes(out)
    r = replay_run(out)
    assert _hashes(out) == before  # the replay writes nothing into the run
    assert r.checkpoint_step == 30 and r.step == 31 and r.precision == "fp16"
    assert r.finding.code == "nonfinite-forward" and r.phase == "forward" and r.module == "mix"
    here = short_path(str(TASK_FILE))  # how every `where` names a file
    # the op's own line (issue 29), the line that called the module in the message
    assert r.finding.where == f"model.mix · {here}:{_line('# OVERFLOW LINE')}"
    assert f"called at {here}:{_line('# MIX CALL')}" in r.finding.message
    assert r.op == "aten.bmm"  # the op without its overload, as every finding names ops
    assert r.op_where == f"{here}:{_line('# OVERFLOW LINE')}"
    assert r.fp32_finite is True and r.cause == "precision"
    assert "--fp32-modules mix" in r.suggestion


def test_fix_check_holds(overflow_run, tmp_path):
    out, _, _ = overflow_run
    rc, stdout, _ = _cli("diagnose", "--replay", str(out), "--fix-check", "--json", str(tmp_path / "r.json"))
    assert rc == 1
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["fix_check"] == {"fp32_modules": "mix", "from_step": 31, "to_step": 35, "skipped_steps": [],
                                "holds": True}
    assert rep["finding"]["code"] == "nonfinite-forward" and rep["cause"] == "precision"
    assert "first bad step 31 (forward)" in stdout and "holds" in stdout


def test_fix_check_counts_a_skip_at_the_bad_step_itself(overflow_run):
    """A module that is not the cause (fc2 in FP32; mix still overflows): the bad step 31 is skipped again,
    and that skip is the first the check reports (issue 47: a check from the step after hid it)."""
    from ampkit.checkpoint.dcp import RunCheckpoints
    from ampkit.diagnose.replay import _choose_checkpoint, _fix_check
    from ampkit.training.record import read_record

    out, _, _ = overflow_run
    record = read_record(out)
    ckpts = RunCheckpoints(out / "checkpoints", keep=10**9, sharded=False)
    ck_step, ck_path, target = _choose_checkpoint(ckpts, record, None)
    assert (ck_step, target) == (30, 31)
    check = _fix_check(record, None, ckpts.folder, ck_path, False, ck_step, target, "fc2", 2)
    assert check["skipped_steps"][0] == 31 and check["holds"] is False


def test_replay_at_a_step_and_without_a_halt_record(overflow_run, tmp_path):
    out, _, _ = overflow_run
    r = replay_run(f"{out}", step=31)
    assert (r.checkpoint_step, r.step, r.module) == (30, 31, "mix")
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    rec = json.loads((copy / "run.json").read_text())
    rec["halt"] = None  # e.g. killed during the streak: the replay finds the first skipped step itself
    (copy / "run.json").write_text(json.dumps(rec))
    r = replay_run(copy)
    assert (r.checkpoint_step, r.step, r.module, r.cause) == (30, 31, "mix", "precision")


def test_replay_at_a_checkpoints_own_step_and_at_the_halts_step(overflow_run):
    """Step 75 is a checkpoint's own step: the replay starts from the one before (70) and replays 75 itself;
    step 80 is where the halt stopped the run: replayed like any other (no TrainingHalted, no skip limit)."""
    out, _, _ = overflow_run
    r = replay_run(out, step=75)
    assert (r.checkpoint_step, r.step, r.module, r.cause) == (70, 75, "mix", "precision")
    r = replay_run(out, step=80)
    assert (r.checkpoint_step, r.step, r.module, r.cause) == (75, 80, "mix", "precision")


def test_a_step_the_run_never_took_is_refused_at_once(overflow_run, tmp_path):
    out, _, _ = overflow_run
    for step in (81, 9999):  # the halt stopped the run at step 80
        rc, stdout, err = _cli("diagnose", "--replay", f"{out}:{step}")
        assert rc == 2 and not stdout and err.strip() == (
            f"ampkit diagnose: error: --replay {out}:{step}: the run's last step was 80, so step {step} was never "
            "taken; give a step from 1 to 80 (or no step: its first bad step)"), err
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    rec = json.loads((copy / "run.json").read_text())
    rec["halt"] = None  # no halt record: the newest of metrics.jsonl's last step and the checkpoints (75)
    (copy / "run.json").write_text(json.dumps(rec))
    with pytest.raises(UsageError, match="the run's last step was 75, so step 76 was never taken"):
        replay_run(copy, step=76)


def test_replay_without_a_checkpoint_starts_from_step_0(tmp_path):
    # No --ckpt-every: the halt leaves no checkpoint, but the seed rebuilds step 0 exactly.
    out = tmp_path / "bare"
    rc, err = _cli("train", "--task", TASK, "--precision", "fp16", "--task-arg", "shift_at=5", "--steps", "100",
                   "--out", str(out))[::2]
    assert rc == 1 and "the replay starts from step 0" in err and not list(out.glob("checkpoints/step-*"))
    r = replay_run(out)
    assert (r.checkpoint, r.checkpoint_step, r.step, r.module, r.cause) == (None, 0, 6, "mix", "precision")
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    rec = json.loads((resumed / "run.json").read_text())
    rec["start_step"] = 3  # a resumed part: its start is a checkpoint, not the seed
    (resumed / "run.json").write_text(json.dumps(rec))
    with pytest.raises(UsageError, match="names no good checkpoint"):
        replay_run(resumed)


def test_replay_of_nan_data_is_not_precision(tmp_path):
    out = tmp_path / "nan"
    rc, err = _train(out, "--task-arg", "mode=data", "--task-arg", "shift_at=10")
    assert rc == 1 and "step-00000010.pt (step 10" in err
    r = replay_run(out)
    assert (r.checkpoint_step, r.step, r.module, r.phase) == (10, 11, "fc1", "forward")
    assert "already inf/NaN" in r.finding.message
    assert r.fp32_finite is False and r.cause == "model-or-data"
    assert "no precision change will help" in r.suggestion


def test_replay_of_a_sharded_checkpoint_on_one_process(tmp_path):
    out = tmp_path / "fsdp"
    rc, err = _train(out, "--task-arg", "shift_at=10", "--strategy", "fsdp")
    assert rc == 1 and "step-00000010.dcp (step 10" in err
    r = replay_run(out)
    assert r.checkpoint.endswith("step-00000010.dcp")
    assert (r.step, r.module, r.cause) == (11, "mix", "precision")
    for shard in (out / "checkpoints" / "step-00000010.dcp").glob("*.distcp"):
        shard.write_bytes(b"torn")  # where torch cannot read the shards, the replay says so in one line
    rc, _, err = _cli("diagnose", "--replay", str(out))
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "sharded (DCP) checkpoint" in err and "cannot be replayed on one process" in err


def test_replay_usage_errors(tmp_path):
    rc, _, err = _cli("diagnose", "--replay", str(tmp_path))
    assert rc == 2 and "has no run.json" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _cli("diagnose", "--fix-check")
    assert rc == 2 and "--fix-check goes with --replay" in err


@pytest.mark.slow
def test_replay_of_a_ddp_run_on_one_process(tmp_path):
    """Two gloo ranks on the CPU (real torchrun); the replay runs the whole global batch in one process."""
    import subprocess
    import sys

    out = tmp_path / "ddp"
    p = subprocess.run([sys.executable, "-m", "ampkit", "train", "--task", TASK, "--task-arg", "shift_at=10",
                        "--precision", "fp16", "--ckpt-every", "5", "--keep", "2", "--steps", "100", "--out",
                        str(out), "--nproc", "2", "--strategy", "ddp"], capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "the last good checkpoint is" in p.stderr and "--replay" in p.stderr
    r = replay_run(out)
    assert (r.checkpoint_step, r.step, r.module, r.cause) == (10, 11, "mix", "precision")
    assert any("2-process ddp run replayed on one process" in n for n in r.notes)


def test_halt_without_out_points_to_out_and_replay():
    rc, _, err = _cli("train", "--task", TASK, "--precision", "fp16", "--task-arg", "shift_at=0", "--steps", "100")
    last = err.strip().splitlines()[-1]
    assert rc == 1 and last.startswith("ampkit train: error: 50 optimizer steps in a row")
    assert "Train with --out DIR" in last and "`ampkit diagnose --replay DIR`" in last and "SCRIPT" not in last
