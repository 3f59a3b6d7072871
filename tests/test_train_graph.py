"""The whole training step as one device graph by default (``TrainConfig.graph``, ``--no-graph``).

On the CPU there are no device graphs: the runs are eager and say why only when asked for a graph. The
reasons a step cannot be captured are checked with a device that claims graphs. The GPU tests compare
eager and graphed runs step by step (run through the device tool)."""

from __future__ import annotations

import os

import pytest
import torch

import ampkit
from ampkit.cli import main
from ampkit.device import Device
from ampkit.training.trainer import TrainConfig, train
from ampkit.training.setup import graph_blocker

HERE = os.path.dirname(__file__)
TOY = os.path.join(HERE, "toy_task.py") + ":make_task"


def test_cpu_runs_eagerly_and_says_so_only_when_asked():
    r = train(TrainConfig(task=TOY, precision="fp32", steps=3, evaluate=False))
    assert r.step_graph is False and r.step_graph_fallback == "cpu has no device graphs"
    assert not any("graph" in n for n in r.notes)  # the CPU never has graphs: no note on every run
    forced = train(TrainConfig(task=TOY, precision="fp32", steps=3, evaluate=False, graph=True))
    assert forced.step_graph is False
    assert "eager steps, no step graph: cpu has no device graphs" in forced.notes


class _GraphDevice:
    """A device that claims graph capture: what the planning checks see on a GPU."""

    type = "cuda"

    def graph_api(self):
        return (object, object)


class _Ctx:
    world_size = 2


@pytest.fixture
def toy():
    return ampkit.load_task(TOY)


def test_graph_planned_where_nothing_blocks_it(toy):
    assert graph_blocker(TrainConfig(task=TOY), None, toy, [], _GraphDevice()) is None


@pytest.mark.parametrize("case,reason", [
    ("no-graph", "--no-graph"),
    ("cpu", "cpu has no device graphs"),
    ("ranks", "several processes"),
    ("accumulation", "gradient accumulation"),
    ("task", "Task.graphable=False"),
    ("callback", "before_step"),
])
def test_what_keeps_a_step_eager(case, reason, toy):
    config, ctx, device, callbacks = TrainConfig(task=TOY), None, _GraphDevice(), []
    if case == "no-graph":
        config = TrainConfig(task=TOY, graph=False)
    elif case == "cpu":
        device = Device("cpu")
    elif case == "ranks":
        ctx = _Ctx()
    elif case == "accumulation":
        config = TrainConfig(task=TOY, accumulation_steps=2)
    elif case == "task":
        toy.graphable = False
    else:
        class Plant(ampkit.Callback):
            def before_step(self, state):
                pass

        callbacks = [Plant()]
    assert reason in graph_blocker(config, ctx, toy, callbacks, device)


def test_an_after_step_callback_does_not_block_the_graph(toy):
    class Watch(ampkit.Callback):
        def after_step(self, state):
            pass

    assert graph_blocker(TrainConfig(task=TOY), None, toy, [Watch()], _GraphDevice()) is None


def test_no_graph_flag(tmp_path, capsys):
    assert main(["train", "--task", TOY, "--precision", "fp32", "--steps", "2", "--no-graph", "--json"]) == 0


def test_compare_on_the_cpu_reports_no_graph_speedup():
    r = ampkit.compare(TOY, precision="bf16", seeds=1, steps=4, log_every=2, run_audit=False)
    assert r.ratios["step_graph"] is False and "speedup_eager" not in r.ratios


# ---------------------------------------------------------------------------------------------- GPU
def _skip_task(seed: int = 0):
    """The toy task with a non-finite batch at micro-step 7: the step is skipped, eager or graphed."""
    task = ampkit.load_task(TOY, seed=seed)
    clean = task.batch

    def batch(step):
        x, y = clean(step)
        if step == 7:
            x = x.clone()
            x[0, 0] = float("inf")
        return x, y

    task.batch = batch
    return task


def _no_dropout(task):
    # Dropout draws from the RNG in a different order when the step is a replayed graph.
    task.model = torch.nn.Sequential(*[m for m in task.model if not isinstance(m, torch.nn.Dropout)])
    return task


def _run(precision, graph):
    return train(TrainConfig(task=TOY, precision=precision, steps=20, log_every=1, evaluate=False, graph=graph),
                 task=_no_dropout(_skip_task()))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_graphed_training_matches_eager_step_by_step(precision):
    eager, graphed = _run(precision, False), _run(precision, None)
    assert graphed.step_graph is True and eager.step_graph is False
    assert [h["step"] for h in graphed.history] == [h["step"] for h in eager.history]
    assert graphed.skipped == eager.skipped == 1
    for a, b in zip(eager.history, graphed.history):
        assert a["skipped"] == b["skipped"] and a["scale"] == b["scale"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), (a, b)


@pytest.mark.gpu
def test_graphed_resume_matches_the_uninterrupted_run(tmp_path):
    whole = _run("fp16", None)
    first = train(TrainConfig(task=TOY, precision="fp16", steps=10, log_every=1, evaluate=False,
                              out=str(tmp_path / "r"), ckpt_every=10), task=_no_dropout(_skip_task()))
    second = train(TrainConfig(task=TOY, precision="fp16", steps=20, log_every=1, evaluate=False,
                               out=str(tmp_path / "r"), resume=True), task=_no_dropout(_skip_task()))
    assert first.step_graph and second.step_graph and second.start_step == 10
    resumed = {h["step"]: h["loss"] for h in first.history + second.history}
    for h in whole.history:
        assert resumed[h["step"]] == pytest.approx(h["loss"], rel=1e-3, abs=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_default_task_on_a_gpu_is_the_large_model_graphed_to_95_percent(precision):
    # The README's main job on a GPU: digits sizes itself for the device, keeps its images there, and the
    # whole step is captured in every precision (so compare's speed-up compares precisions).
    r = train(TrainConfig(task="digits", precision=precision, log_every=50))
    task = ampkit.load_task("digits", device="cuda")
    assert task.extra["size"] == "large" and task.batch(0)[0].is_cuda
    assert r.step_graph is True and r.steps == task.default_steps and r.skipped <= 3
    assert r.metrics["accuracy"] >= 0.95, r.metrics


def _reads_under_autocast(seed: int = 0):
    """The toy task whose model reads the device on the host only under autocast: the AMP runs cannot be
    captured, the FP32 runs can."""
    task = ampkit.load_task(TOY, seed=seed)
    inner = task.model

    class Reads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if torch.is_autocast_enabled(x.device.type):
                float(x.sum())  # a host read the AMP runs alone make
            return self.inner(x)

    task.model = Reads()
    return task


@pytest.mark.gpu
def test_compare_trains_both_precisions_eagerly_when_only_one_can_be_graphed():
    r = ampkit.compare(_reads_under_autocast, precision="bf16", seeds=2, steps=12, log_every=4, run_audit=False)
    assert r.ratios["step_graph"] is False and r.ratios.get("speedup_eager") is None
    assert any("BF16 could not run as one device graph" in n and "both precisions trained with eager steps" in n
               for n in r.notes), r.notes
