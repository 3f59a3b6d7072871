"""Trainer features beyond the loop itself: callbacks, stop signals, LR schedulers in checkpoints,
dict batches, --init-scale, and their one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from torch import nn

import ampkit
from ampkit.errors import UsageError
from ampkit.training.trainer import TrainConfig, train
from ampkit.training import stop as stop_mod
from ampkit.training.stop import StopRequest, parse_signal

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "toy_task.py") + ":make_task"


# ---------------------------------------------------------------- callbacks
class Recorder(ampkit.Callback):
    def __init__(self):
        self.calls = []

    def on_start(self, state):
        self.calls.append(("start", state.step))

    def before_step(self, state):
        has_grad = any(p.grad is not None for p in state.model.parameters())
        self.calls.append(("before", state.step, has_grad))

    def after_step(self, state):
        self.calls.append(("after", state.step))

    def on_end(self, state):
        self.calls.append(("end", state.step, state.stop))


def test_callbacks_see_each_step_with_its_gradients(tmp_path):
    rec = Recorder()
    train(TrainConfig(task=TOY, precision="fp32", steps=3, evaluate=False, callbacks=(rec,)))
    assert rec.calls == [("start", 0), ("before", 0, True), ("after", 1), ("before", 1, True), ("after", 2),
                         ("before", 2, True), ("after", 3), ("end", 3, None)]


def test_callback_spec_from_a_file(tmp_path):
    spec = tmp_path / "cb.py"
    spec.write_text("import ampkit\nSEEN = []\nclass C(ampkit.Callback):\n"
                    "    def after_step(self, state):\n        SEEN.append(state.step)\n"
                    "def make():\n    return C()\n")
    r = train(TrainConfig(task=TOY, precision="fp32", steps=2, evaluate=False, callbacks=(f"{spec}:make",)))
    assert r.steps == 2
    mod = next(m for name, m in sys.modules.items() if name.startswith("ampkit_user_callback_"))
    assert mod.SEEN == [1, 2]


def test_an_object_without_hooks_is_refused():
    with pytest.raises(UsageError, match="is not a callback"):
        train(TrainConfig(task=TOY, precision="fp32", steps=1, callbacks=(object(),)))


# ---------------------------------------------------------------- stop signals
def test_parse_signal_names():
    assert parse_signal("USR1") == parse_signal("SIGUSR1") == parse_signal(str(int(signal.SIGUSR1))) == signal.SIGUSR1
    with pytest.raises(UsageError, match="not a signal"):
        parse_signal("NOPE")
    with pytest.raises(UsageError, match="cannot be caught"):
        parse_signal("SIGKILL")


def test_second_signal_after_the_grace_period_stops_at_once(monkeypatch):
    seen = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        stop = StopRequest((int(signal.SIGUSR2),))
        with stop.installed():
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR2)  # within GRACE_S: the same request, forwarded twice
            assert stop.received == signal.SIGUSR2 and seen == []
            monkeypatch.setattr(stop_mod, "GRACE_S", 0.0)
            os.kill(os.getpid(), signal.SIGUSR2)  # a real second request: the previous handler takes it
            assert seen == [signal.SIGUSR2]
        assert stop.should_stop(1) and stop.name == "SIGUSR2"
    finally:
        signal.signal(signal.SIGUSR2, old)


class _TwoRanks:
    """A stand-in process group of two: the other rank's flag is ``other``; counts the all_reduces."""

    world_size = 2

    def __init__(self, other: int) -> None:
        self.other, self.reduces = other, 0

    def max_(self, flag):
        self.reduces += 1
        flag.clamp_(min=self.other)
        return flag


def test_ranks_agree_only_on_check_steps():
    ctx = _TwoRanks(other=int(signal.SIGTERM))  # the other rank got SIGTERM; this one got nothing
    stop = StopRequest((int(signal.SIGTERM),), ctx=ctx, check_every=4)
    assert [stop.should_stop(s) for s in (1, 2, 3)] == [False, False, False] and ctx.reduces == 0
    assert stop.should_stop(4) and stop.name == "SIGTERM" and ctx.reduces == 1
    quiet = StopRequest((int(signal.SIGTERM),), ctx=_TwoRanks(other=0), check_every=4)
    assert not quiet.should_stop(4)


@pytest.mark.parametrize("sig,extra", [(signal.SIGTERM, []), (signal.SIGUSR1, ["--stop-signal", "USR1"])])
def test_signal_saves_checkpoint_and_exits_with_its_code(tmp_path, sig, extra):
    import json
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ampkit", "train", "--task", TOY, "--steps", "1000000",
                             "--out", str(out), "--log-every", "1", "--precision", "fp32", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert f"stopped by {sig.name}" in stdout and "checkpoint saved" in stdout
    from ampkit.checkpoint import CheckpointManager

    found = CheckpointManager(out / "checkpoints").latest()
    assert found.state["step"] == json.loads(metrics.read_text().splitlines()[-1])["step"]


# ---------------------------------------------------------------- schedulers, optimizers, batches
def _scheduled_task(seed: int = 0) -> ampkit.Task:
    task = ampkit.load_task(TOY, seed=seed)
    task.make_optimizer = lambda model: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    task.make_scheduler = lambda opt, total: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return task


def test_task_scheduler_steps_and_resumes_exactly(tmp_path):
    common = dict(task=TOY, precision="fp32", log_every=1, evaluate=False)
    full = train(TrainConfig(**common, steps=10), task=_scheduled_task())
    assert [round(r["lr"], 6) for r in full.history] == [0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025,
                                                        0.0125, 0.0125]
    out = tmp_path / "run"
    train(TrainConfig(**common, steps=4, out=str(out)), task=_scheduled_task())
    resumed = train(TrainConfig(**common, steps=10, out=str(out), resume=True), task=_scheduled_task())
    assert resumed.start_step == 4
    assert [(r["lr"], r["loss"]) for r in resumed.history] == [(r["lr"], r["loss"]) for r in full.history[4:]]


def test_resume_into_a_scheduler_from_a_checkpoint_without_one_says_so(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(task=TOY, precision="fp32", steps=2, out=str(out), evaluate=False))
    task = ampkit.load_task(TOY)  # the default optimizer, now with a schedule
    task.make_scheduler = lambda opt, total: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    r = train(TrainConfig(task=TOY, precision="fp32", steps=3, out=str(out), resume=True, evaluate=False), task=task)
    assert any("no scheduler state" in n for n in r.notes), r.notes


def test_make_optimizer_must_return_an_optimizer():
    task = ampkit.load_task(TOY)
    task.make_optimizer = lambda model: "adam"
    with pytest.raises(UsageError, match="not a torch optimizer"):
        train(TrainConfig(task=TOY, precision="fp32", steps=1), task=task)


def make_dict_task(seed: int = 0) -> ampkit.Task:
    """HF style: the batch is {"inputs": ..., "labels": ...} with a nested tuple."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(256, 6, generator=g), torch.randint(0, 3, (256,), generator=g)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def batch(step):
        i = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(seed * 1000 + step))
        return {"inputs": x[i], "labels": (y[i], "a string passes through")}

    def loss(model, b):
        assert b["labels"][1] == "a string passes through"
        return nn.functional.cross_entropy(model(b["inputs"]), b["labels"][0])

    return ampkit.Task(name="dict", model=model, batch=batch, loss=loss, samples_per_batch=16, default_steps=4)


def test_dict_batches_train_from_the_cli(capsys):
    import json

    from ampkit.cli import main

    assert main(["train", "--task", f"{__file__}:make_dict_task", "--precision", "bf16", "--steps", "4",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 4 and result["final_loss"] is not None


def test_shard_batch_keeps_the_batch_structure():
    from ampkit.distributed import shard_batch

    b = {"inputs": torch.arange(8).reshape(4, 2), "labels": (torch.arange(4), "keep")}
    part = shard_batch(b, 1, 2)
    assert part["inputs"].tolist() == [[2, 3], [6, 7]] and part["labels"][0].tolist() == [1, 3]
    assert part["labels"][1] == "keep"


# ---------------------------------------------------------------- --fp32-modules
class _OutputDtype(ampkit.Callback):
    def on_start(self, state):
        with state.amp.autocast():
            self.dtypes = [m(torch.randn(4, 10)).dtype for m in (state.model, state.model[0])]


@pytest.mark.parametrize("spec,want", [(None, torch.bfloat16), ("3", torch.float32)])
def test_fp32_modules_run_in_fp32_for_the_run_only(spec, want):
    task = ampkit.load_task(TOY)
    probe = _OutputDtype()
    r = train(TrainConfig(task=TOY, precision="bf16", steps=1, evaluate=False, fp32_modules=spec,
                          callbacks=(probe,)), task=task)
    assert probe.dtypes == [want, torch.bfloat16]  # the model's output (module 3), and module 0 untouched
    assert any(n == "FP32 regions: 3" for n in r.notes) == (spec is not None)
    assert not task.model[3]._forward_pre_hooks  # removed when the run ends


# ---------------------------------------------------------------- --init-scale
def test_init_scale_reaches_the_engine():
    r = train(TrainConfig(task=TOY, precision="fp16", steps=2, log_every=1, evaluate=False, init_scale=1024.0))
    assert r.history[0]["scale"] == 1024.0


@pytest.mark.parametrize("argv,needle", [
    (["--init-scale", "0"], "--init-scale must be a positive number"),
    (["--init-scale", "nan"], "--init-scale must be a positive number"),
    (["--stop-signal", "SIGNOPE"], "is not a signal here"),
    (["--stop-check-every", "0"], "--stop-check-every must be >= 1"),
    (["--callback", "nosuch.py:make"], "callback file 'nosuch.py' does not exist"),
    (["--callback", "nocolon"], "bad callback 'nocolon'"),
    (["--fp32-modules", "a..b"], "fp32_modules: not a dotted module name"),
    (["--max-grad-norm", "nan"], "max_grad_norm must be a finite number"),
    (["--fp32-modules", "nosuch"], "nosuch"),
])
def test_bad_flags_one_line(argv, needle, capsys):
    from ampkit.cli import main

    assert main(["train", "--task", TOY, "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


# ---------------------------------------------------------------- the scale monitor
def test_scale_monitor_warns_once_with_the_advice_it_was_given():
    from ampkit.engine.monitor import ScaleMonitor

    m = ScaleMonitor(window=10, max_backoffs=2, floor=1.0, advice="use --precision bf16 (x)")
    assert m.update(5, 1024.0, 2) is None  # 2 backoffs: not more than 2
    w = m.update(6, 512.0, 3)
    assert w.code == "scale-collapse" and "backed off 3 times" in w.message
    assert w.fix.startswith("use --precision bf16 (x); or keep") and "--fp32-modules" in w.fix
    assert m.update(7, 0.5, 9) is None  # once per run
    assert ScaleMonitor(floor=1.0).update(1, 1.0, 0).fix.startswith("lower the learning rate")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_skipped_step_does_not_advance_the_trainers_schedule(precision):
    # The loop hands its scheduler to the engine: a step skipped for a non-finite gradient leaves the
    # learning rate where it was (here: an inf planted before step 3 of 6).
    class PlantInf(ampkit.Callback):
        def before_step(self, state):
            if state.step == 2:
                next(state.model.parameters()).grad.fill_(float("inf"))

        def on_end(self, state):
            state.amp.sync_schedulers()
            self.last_epoch = state.scheduler.last_epoch
            self.skipped = state.amp.stats()["skipped"]

    watch = PlantInf()
    task = ampkit.load_task(TOY)
    task.make_scheduler = lambda opt, total: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    train(TrainConfig(task=TOY, precision=precision, steps=6, evaluate=False, callbacks=(watch,)), task=task)
    assert watch.skipped == 1
    assert watch.last_epoch == 5  # 6 optimizer steps, 5 applied
