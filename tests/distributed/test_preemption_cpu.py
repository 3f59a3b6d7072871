"""Preemption on two real torchrun ranks (gloo, CPU): SIGTERM to the launcher mid-run, every rank stops
after the same step with one checkpoint, the job exits 143, and ``--resume`` continues to the
uninterrupted run's losses with each step logged once. DDP and FSDP2 (sharded checkpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _runs import RTOL, TASK_ARGS, TASK_OPTIONS, ampkit, assert_losses_close, dumps, env, metrics  # noqa: E402
from faults import FAULTS  # noqa: E402

from ampkit.training.trainer import TrainConfig, train  # noqa: E402

STEPS, SIGNAL_AFTER, CHECK_EVERY = 12, 3, 2


def _launch_and_signal(args: list[str], out, dump, sig: int = signal.SIGTERM, timeout: float = 120):
    """``ampkit train --nproc 2 ARGS``; once rank 0 has finished step SIGNAL_AFTER, ``sig`` to the launcher."""
    proc = subprocess.Popen([sys.executable, "-m", "ampkit", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env(FAULTS_MARK_AT=str(SIGNAL_AFTER), FAULTS_SLOW="0.3", FAULTS_DUMP=str(dump)))
    marker = out / f".faults-step-{SIGNAL_AFTER}"
    deadline = time.time() + timeout
    try:
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sigterm_stops_every_rank_at_one_step_and_resume_matches(tmp_path, strategy):
    out, dump = tmp_path / "run", tmp_path / "dump"
    common = [*TASK_ARGS, "--nproc", "2", "--precision", "fp32", "--steps", str(STEPS), "--log-every", "1",
              "--out", str(out)]
    code, stdout, stderr = _launch_and_signal([*common, "--strategy", strategy, "--callback", FAULTS,
                                               "--stop-check-every", str(CHECK_EVERY)], out, dump)
    assert code == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    ranks = dumps(dump)
    stopped = ranks[0]["step"]
    # Both ranks stopped after the same step, the first agreement step after the signal, on SIGTERM.
    assert [(r["rank"], r["step"], r["stop"]) for r in ranks] == [(0, stopped, "SIGTERM"), (1, stopped, "SIGTERM")]
    assert SIGNAL_AFTER < stopped < STEPS and stopped % CHECK_EVERY == 0, ranks
    assert f"stopped by SIGTERM at step {stopped}: checkpoint saved" in stdout
    kind = ".dcp" if strategy == "fsdp" else ".pt"
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [f"step-{stopped:08d}{kind}"]
    assert [r["step"] for r in metrics(out)] == list(range(1, stopped + 1))

    # --resume without --strategy: the newest checkpoint of either kind is found (DDP loads the sharded one).
    p = ampkit(["train", *common, "--resume"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"at step {stopped}" in p.stderr
    recs = metrics(out)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))  # each step logged once
    ref = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision="fp32", steps=STEPS, log_every=1,
                            evaluate=False))
    assert_losses_close([r["loss"] for r in recs], [h["loss"] for h in ref.history], RTOL["fp32"])


def test_a_signal_on_one_rank_stops_both_at_the_agreed_step(tmp_path):
    """Only rank 1 gets the warning signal (``--stop-signal SIGUSR1``): rank 0 learns it through the stop
    flag's all_reduce, both save the step-4 checkpoint together and exit 128 + SIGUSR1."""
    out, dump = tmp_path / "run", tmp_path / "dump"
    p = ampkit(["train", *TASK_ARGS, "--nproc", "2", "--strategy", "ddp", "--precision", "fp32", "--steps", "8",
                "--log-every", "1", "--out", str(out), "--callback", FAULTS, "--stop-signal", "SIGUSR1",
                "--stop-check-every", "4"],
               extra_env={"FAULTS_SIGNAL_AT": "2", "FAULTS_SIGNAL_RANK": "1", "FAULTS_DUMP": str(dump)})
    assert p.returncode == 128 + signal.SIGUSR1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert [(r["rank"], r["step"], r["stop"]) for r in dumps(dump)] == [(0, 4, "SIGUSR1"), (1, 4, "SIGUSR1")]
    assert sorted(x.name for x in (out / "checkpoints").glob("step-*")) == ["step-00000004.pt"]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
