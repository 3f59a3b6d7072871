import json
import os
import subprocess
import sys

import pytest
import torch

from ampkit.cli import main
from ampkit.training.trainer import TrainConfig, train

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "toy_task.py") + ":make_task"


def _final_params(out):
    from ampkit.checkpoint import CheckpointManager

    return CheckpointManager(os.path.join(out, "checkpoints")).latest().state["model"]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_resume_is_bit_exact(tmp_path, precision):
    full = train(TrainConfig(task=TOY, precision=precision, steps=24, out=str(tmp_path / "full"), log_every=1,
                             ckpt_every=100))
    a = tmp_path / "split"
    train(TrainConfig(task=TOY, precision=precision, steps=11, out=str(a), log_every=1, ckpt_every=11))
    resumed = train(TrainConfig(task=TOY, precision=precision, steps=24, out=str(a), log_every=1, ckpt_every=100,
                                resume=True))
    assert resumed.start_step == 11 and resumed.resumed_from
    assert [r["loss"] for r in full.history[11:]] == [r["loss"] for r in resumed.history]
    pa, pb = _final_params(str(tmp_path / "full")), _final_params(str(a))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    lines = (a / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["step"] for l in lines] == list(range(1, 25))  # no lost or repeated step


def test_metrics_fields(tmp_path):
    r = train(TrainConfig(task=TOY, precision="fp16", steps=10, out=str(tmp_path), log_every=5))
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(rec) >= {"step", "loss", "scale", "skipped", "grad_norm", "samples_per_s", "peak_mem_bytes"}
    assert rec["step"] == 10 and rec["scale"] > 0
    assert r.metrics["accuracy"] > 0.5


def test_resume_without_checkpoint_starts_fresh(tmp_path):
    r = train(TrainConfig(task=TOY, precision="fp32", steps=3, out=str(tmp_path), resume=True))
    assert r.start_step == 0 and any("from scratch" in n for n in r.notes)


def test_resume_under_other_precision(tmp_path):
    train(TrainConfig(task=TOY, precision="fp16", steps=5, out=str(tmp_path), ckpt_every=5))
    r = train(TrainConfig(task=TOY, precision="bf16", steps=8, out=str(tmp_path), resume=True))
    assert r.start_step == 5 and any("scaler state dropped" in n for n in r.notes)


def test_corrupt_newest_checkpoint_falls_back(tmp_path):
    train(TrainConfig(task=TOY, precision="fp32", steps=6, out=str(tmp_path), ckpt_every=3))
    newest = tmp_path / "checkpoints" / "step-00000006.pt"
    newest.write_bytes(b"garbage")
    r = train(TrainConfig(task=TOY, precision="fp32", steps=8, out=str(tmp_path), resume=True))
    assert r.start_step == 3
    assert any("step-00000006.pt" in n for n in r.notes)


def test_resume_into_another_model_stops_and_keeps_the_run(tmp_path):
    # The checkpoints read well but belong to another model (the task's options changed, or digits was trained
    # on a GPU, where it is the large model): starting from scratch would overwrite them. One line, exit 1.
    train(TrainConfig(task=TOY, precision="fp32", steps=4, out=str(tmp_path), ckpt_every=2, log_every=1))
    files = {p.name: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    out = _cli("train", "--task", TOY, "--task-arg", "hidden=8", "--steps", "6", "--out", str(tmp_path), "--resume")
    assert out.returncode == 1, out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "step-00000004.pt does not fit this run" in err[0], err
    assert "missing" in err[0] or "size mismatch" in err[0]
    assert "train into another --out" in err[0] and "Traceback" not in out.stderr
    assert {p.name: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == files  # nothing lost


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "ampkit", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv,needle", [
    (["train", "--task", "nosuch"], "unknown task"),
    (["train", "--task", TOY, "--steps", "-3"], "--steps must be"),
    (["train", "--task", TOY, "--out", "/proc/forbidden"], "cannot write to --out"),
    (["train", "--task", TOY, "--resume"], "need --out"),
    (["train", "--task", "missing.py:make"], "does not exist"),
    (["train", "--task", TOY, "--task-arg", "nosuch=1"], "takes no option"),
    (["train", "--task", TOY, "--precision", "fp8"], "has no FP8 training"),
    (["train", "--task", TOY, "--task-arg", "hidden=abc"], "option hidden takes int values"),
    (["train", "--task", TOY, "--out", "/dev/null"], "is not a folder"),
])
def test_cli_bad_input_one_line(argv, needle):
    p = _cli(*argv)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert needle in p.stderr


def test_cli_train_json(tmp_path, capsys):
    assert main(["train", "--task", TOY, "--steps", "5", "--json", "--task-arg", "hidden=16"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["steps"] == 5 and r["precision"] in ("bf16", "fp16")


def test_tensorboard_events_written(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(TrainConfig(task=TOY, precision="fp16", steps=10, out=str(tmp_path), log_every=5, tensorboard=True))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"loss", "scale", "grad_norm"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("loss")] == [5, 10]
