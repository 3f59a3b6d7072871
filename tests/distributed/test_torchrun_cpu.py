"""Real torchrun, two gloo processes on the CPU: DDP and FSDP2 against one process, skip agreement,
sharded checkpoints resumed on 1 and 2 ranks, and a killed rank restarted by torchrun."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _runs import (RTOL, TASK_ARGS, TASK_OPTIONS, ampkit, assert_losses_close, dumps, metrics,  # noqa: E402
                   torchrun)

from faults import FAULTS, Faults  # noqa: E402

from ampkit.training.trainer import TrainConfig, train  # noqa: E402

STEPS, INF_AT, MORE = 6, 3, 9  # 2-rank runs train 6 steps; resumed runs continue to 9


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Single-process runs, per precision, with the same inf planted before step INF_AT (cached)."""
    cache: dict[tuple[str, int], list[float]] = {}

    def get(precision: str, accumulation: int = 1) -> list[float]:
        if (precision, accumulation) not in cache:
            r = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision=precision, steps=MORE,
                                  log_every=1, evaluate=False, accumulation_steps=accumulation,
                                  callbacks=(Faults(inf_at=INF_AT),)))
            assert r.skipped == 1, r.history
            cache[precision, accumulation] = [rec["loss"] for rec in r.history]
        return cache[precision, accumulation]

    return get


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2-rank runs keyed by (strategy, precision), made once: an inf planted on rank 1 only before step INF_AT."""
    made: dict[tuple[str, str, int], tuple] = {}

    def get(strategy: str, precision: str, accumulation: int = 1):
        key = (strategy, precision, accumulation)
        if key not in made:
            base = tmp_path_factory.mktemp(f"{strategy}-{precision}-{accumulation}")
            out, dump = base / "run", base / "dump"
            p = torchrun(2, [*TASK_ARGS, "--strategy", strategy, "--precision", precision, "--steps", str(STEPS),
                             "--log-every", "1", "--ckpt-every", "3", "--out", str(out), "--callback", FAULTS,
                             "--accumulation-steps", str(accumulation)],
                         extra_env={"FAULTS_INF_AT": str(INF_AT), "FAULTS_INF_RANK": "1", "FAULTS_DUMP": str(dump)})
            made[key] = (p, out, dump)
        return made[key]

    return get


# DDP in FP32 is the killed-rank test below (its losses are checked against one process there too):
# the matrix covers DDP and FSDP2 each in FP32 and BF16 with one torchrun start fewer. Gradient
# accumulation (DDP's no_sync, FSDP2's set_requires_gradient_sync) runs in fsdp-bf16 and the killed-rank test.
@pytest.mark.parametrize("strategy,precision,accumulation", [("ddp", "bf16", 1), ("fsdp", "fp32", 1),
                                                             ("fsdp", "bf16", 2), ("fsdp", "fp16", 1)])
def test_two_ranks_match_one_process_and_skip_together(runs, reference, strategy, precision, accumulation):
    p, out, dump = runs(strategy, precision, accumulation)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = metrics(out)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["ranks"] == 2 and "skip_disagreement" not in r for r in recs)
    assert_losses_close([r["loss"] for r in recs], reference(precision, accumulation)[:STEPS], RTOL[precision])
    # The inf was on rank 1's gradients only; both ranks skipped that one step.
    assert [r["skipped"] for r in recs] == [0] * (INF_AT - 1) + [1] * (STEPS - INF_AT + 1), recs
    ranks = dumps(dump)
    assert [d["rank"] for d in ranks] == [0, 1], (ranks, p.stderr[-3000:])
    assert ranks[0]["skipped"] == ranks[1]["skipped"] == 1
    assert ranks[0]["optimizer_steps"] == ranks[1]["optimizer_steps"] == [float(STEPS - 1)]
    if strategy == "ddp":  # replicas: identical parameters on both ranks
        assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
        assert ranks[0]["param_abs_sum"] == ranks[1]["param_abs_sum"]
    assert "step 1:" in p.stderr and p.stderr.count("step 1:") == 1, p.stderr[-3000:]  # only rank 0 prints


def test_fsdp_checkpoint_resumes_on_one_and_two_ranks(runs, reference, tmp_path):
    p, out, _ = runs("fsdp", "fp32")
    assert p.returncode == 0, p.stderr[-3000:]
    ckpts = sorted(x.name for x in (out / "checkpoints").glob("step-*"))
    assert ckpts == ["step-00000003.dcp", "step-00000006.dcp"]
    want = reference("fp32")[STEPS:MORE]

    one = tmp_path / "one"
    shutil.copytree(out, one)
    r = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision="fp32", steps=MORE, log_every=1,
                          out=str(one), resume=True, evaluate=False))  # no --strategy: the .dcp is found
    assert r.start_step == STEPS and any("resharded onto 1" in n for n in r.notes), r.notes
    assert_losses_close([h["loss"] for h in r.history], want, RTOL["fp32"])

    two = tmp_path / "two"
    shutil.copytree(out, two)
    p2 = torchrun(2, [*TASK_ARGS, "--strategy", "fsdp", "--precision", "fp32", "--steps", str(MORE),
                      "--log-every", "1", "--out", str(two), "--resume"])
    assert p2.returncode == 0, p2.stderr[-3000:]
    recs = metrics(two)
    assert [x["step"] for x in recs] == list(range(1, MORE + 1))
    assert_losses_close([x["loss"] for x in recs[STEPS:]], want, RTOL["fp32"])


def test_killed_rank_restarts_and_resumes_without_lost_or_repeated_steps(tmp_path):
    """``--nproc 2 --max-restarts 1``: rank 1 SIGKILLs itself after step 7; torchrun restarts both ranks,
    which resume from the step-6 checkpoint. Two micro-batches per step: DDP's no_sync on the first."""
    out = tmp_path / "run"
    steps = 10
    p = ampkit(["train", *TASK_ARGS, "--nproc", "2", "--max-restarts", "1", "--strategy", "ddp", "--precision", "fp32",
                "--steps", str(steps), "--log-every", "1", "--ckpt-every", "3", "--out", str(out), "--callback", FAULTS,
                "--accumulation-steps", "2"],
               extra_env={"FAULTS_KILL_AT": "7"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert (out / ".faults-killed").read_text() == "7"  # the kill happened
    assert "torchrun restart 1: resuming" in p.stderr and "at step 6" in p.stderr
    recs = metrics(out)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # each step exactly once
    ref = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision="fp32", steps=steps, log_every=1,
                            evaluate=False, accumulation_steps=2))
    assert_losses_close([r["loss"] for r in recs], [h["loss"] for h in ref.history], RTOL["fp32"])
