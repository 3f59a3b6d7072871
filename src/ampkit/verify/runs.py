"""The training runs behind ``compare`` and ``compare --explain``: one seed, one precision, same weights and data.

A :class:`RunPlan` is what every run of a comparison shares (task maker, seeds, steps, logging, the
two precisions); :meth:`RunPlan.run` trains one seed through the public trainer
(:func:`ampkit.training.trainer.train`) from the seed's recorded initial weights, optionally with FP32
regions, another learning rate or fewer steps. Nothing here judges or prints.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ampkit.device.policy import Precision
from ampkit.tasks import Task
from ampkit.training.trainer import TrainConfig, TrainResult, train
from ampkit.verify.band import RunOutcome
from ampkit.verify.interrupt import finished

__all__ = ["RunPlan", "Run", "Abort", "median", "outcome"]

Progress = Callable[[dict[str, Any]], None]


class Abort(Exception):
    """Raised from a progress callback to stop a run early (explain's reruns stop at a first non-finite loss)."""


@dataclass
class Run:
    """One finished run: the trainer's result, the judged final metric, its wall time (build + train + eval)."""

    seed: int
    precision: str
    result: TrainResult
    metric: str
    final: float
    wall_s: float
    fp32_modules: tuple[str, ...] = ()
    aborted: str | None = None


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def outcome(run: Run) -> RunOutcome:
    """What the verdict reads from a run."""
    r = run.result
    return RunOutcome(curve=[[int(h["step"]), h["loss"]] for h in r.history], final=run.final, steps=r.steps,
                      skipped=r.skipped, warnings=tuple(r.warnings))


def _final_value(task: Task, result: TrainResult) -> tuple[str, float]:
    if task.metric and task.metric in result.metrics:
        return task.metric, float(result.metrics[task.metric])
    loss = result.final_loss
    return "training loss", float(loss) if loss is not None else float("nan")


@dataclass
class RunPlan:
    """What every run of one comparison shares. ``inits`` holds each seed's initial weights once recorded."""

    make: Callable[[int], Task]
    seeds: tuple[int, ...]
    steps: int
    log_every: int
    lr: float | None
    fp32: Precision
    amp: Precision
    inits: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    first_task: Task | None = None
    graph: bool | None = None  # TrainConfig.graph: the step as one device graph where possible (None)
    fp8_recipe: str = "tensorwise"  # TrainConfig.fp8_recipe / fp8_layers, for --precision fp8
    fp8_layers: str = "paying"
    weights: str = "fp32"  # TrainConfig.weights of the AMP runs (the FP32 runs keep FP32 weights)

    def task(self, seed: int) -> Task:
        """The seed's task with its recorded initial weights (recorded on first use)."""
        if self.first_task is not None and seed == self.seeds[0] and seed not in self.inits:
            task = self.first_task
        else:
            task = self.make(seed)
        if seed in self.inits:
            task.model.load_state_dict(self.inits[seed])  # the same initial weights, whatever the factory does
        else:
            # Kept on the host: a comparison of N seeds of a large model must not hold N copies on the device.
            self.inits[seed] = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                                for k, v in task.model.state_dict().items()}
        return task

    def run(self, seed: int, precision: Precision, *, fp32_modules: tuple[str, ...] = (), lr: float | None = None,
            steps: int | None = None, evaluate: bool = True, progress: Progress | None = None,
            graph: bool | None = None) -> tuple[Task, Run]:
        """Train one seed in ``precision`` (the plan's learning rate unless ``lr``, the plan's graph setting
        unless ``graph``); return the task and the run."""
        t0 = time.perf_counter()
        task = self.task(seed)
        config = TrainConfig(task=task.name, precision=precision.name, steps=steps or self.steps, seed=seed,
                             log_every=min(self.log_every, steps or self.steps), evaluate=evaluate,
                             lr=lr if lr is not None else self.lr, max_consecutive_skips=None,
                             graph=self.graph if graph is None else graph, fp32_modules=tuple(fp32_modules) or None,
                             fp8_recipe=self.fp8_recipe, fp8_layers=self.fp8_layers,
                             weights=self.weights if precision.name != "fp32" else "fp32")
        result = finished(train(config, task=task, precision=precision, progress=progress))  # a stop ends all
        metric, value = _final_value(task, result) if evaluate else ("training loss", float("nan"))
        return task, Run(seed=seed, precision=precision.name, result=result, metric=metric, final=value,
                         wall_s=time.perf_counter() - t0, fp32_modules=tuple(fp32_modules))
