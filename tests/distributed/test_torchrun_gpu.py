"""The CPU suite's scenarios on two GPUs with NCCL, in BF16 and FP16 (skipped without two GPUs).

Run on the two-GPU machine by ``benchmarks/run_h200_distributed.sh``.
"""

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

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

STEPS, INF_AT, MORE = 6, 3, 9
GPU_ARGS = [*TASK_ARGS, "--device", "cuda"]


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, list[float]] = {}

    def get(precision: str) -> list[float]:
        if precision not in cache:
            r = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision=precision, steps=MORE,
                                  log_every=1, evaluate=False, device="cuda",
                                  callbacks=(Faults(inf_at=INF_AT),)))
            assert r.skipped == 1
            cache[precision] = [rec["loss"] for rec in r.history]
        return cache[precision]

    return get


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    made: dict[tuple[str, str], tuple] = {}

    def get(strategy: str, precision: str):
        key = (strategy, precision)
        if key not in made:
            base = tmp_path_factory.mktemp(f"gpu-{strategy}-{precision}")
            out, dump = base / "run", base / "dump"
            p = torchrun(2, [*GPU_ARGS, "--strategy", strategy, "--precision", precision, "--steps", str(STEPS),
                             "--log-every", "1", "--ckpt-every", "3", "--out", str(out), "--callback", FAULTS],
                         extra_env={"FAULTS_INF_AT": str(INF_AT), "FAULTS_INF_RANK": "1", "FAULTS_DUMP": str(dump)})
            made[key] = (p, out, dump)
        return made[key]

    return get


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_nccl_two_gpus_match_one_and_skip_together(runs, reference, strategy, precision):
    p, out, dump = runs(strategy, precision)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = metrics(out)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["ranks"] == 2 and "skip_disagreement" not in r for r in recs)
    assert_losses_close([r["loss"] for r in recs], reference(precision)[:STEPS], RTOL[precision])
    assert [r["skipped"] for r in recs] == [0] * (INF_AT - 1) + [1] * (STEPS - INF_AT + 1)
    ranks = dumps(dump)
    assert ranks[0]["skipped"] == ranks[1]["skipped"] == 1
    assert ranks[0]["scale"] == ranks[1]["scale"]
    assert ranks[0]["optimizer_steps"] == ranks[1]["optimizer_steps"] == [float(STEPS - 1)]
    if strategy == "ddp":
        assert ranks[0]["param_sum"] == ranks[1]["param_sum"]


@pytest.mark.parametrize("precision", ["bf16"])
def test_nccl_fsdp_checkpoint_resumes_on_one_and_two_gpus(runs, reference, tmp_path, precision):
    p, out, _ = runs("fsdp", precision)
    assert p.returncode == 0, p.stderr[-3000:]
    want = reference(precision)[STEPS:MORE]
    one = tmp_path / "one"
    shutil.copytree(out, one)
    r = train(TrainConfig(task="charlm", task_options=TASK_OPTIONS, precision=precision, steps=MORE, log_every=1,
                          out=str(one), resume=True, strategy="fsdp", evaluate=False, device="cuda"))
    assert r.start_step == STEPS
    assert_losses_close([h["loss"] for h in r.history], want, RTOL[precision])
    two = tmp_path / "two"
    shutil.copytree(out, two)
    p2 = torchrun(2, [*GPU_ARGS, "--strategy", "fsdp", "--precision", precision, "--steps", str(MORE),
                      "--log-every", "1", "--out", str(two), "--resume"])
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert_losses_close([x["loss"] for x in metrics(two)[STEPS:]], want, RTOL[precision])


def test_nccl_killed_rank_restarts(tmp_path):
    out = tmp_path / "run"
    p = ampkit(["train", *GPU_ARGS, "--nproc", "2", "--max-restarts", "1", "--strategy", "fsdp", "--precision", "fp16",
                "--steps", "10", "--log-every", "1", "--ckpt-every", "3", "--out", str(out), "--callback", FAULTS],
               extra_env={"FAULTS_KILL_AT": "7"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert (out / ".faults-killed").exists()
    assert [r["step"] for r in metrics(out)] == list(range(1, 11))
