"""The trainer: ``train(TrainConfig(...))`` runs setup, resume, the loop and evaluation, and returns
what happened. The parts live beside it in :mod:`ampkit.training` (config, setup, resume, loop, metrics, stop,
callbacks).

>>> from ampkit.training import TrainConfig, train
>>> result = train(TrainConfig(task="digits", precision="bf16", steps=200, out="runs/digits"))  # doctest: +SKIP
>>> result.metrics["accuracy"]                                                                     # doctest: +SKIP
0.97

Nothing here prints: progress goes to the ``progress`` callback (the CLI draws a bar with it).

Under torchrun (``ampkit train --nproc N``, or ``torchrun -m ampkit train``) the same loop runs on every
rank with ``strategy="ddp" | "fsdp"``: see :mod:`ampkit.distributed`. Only rank 0 reports and writes.
SIGINT, SIGTERM and ``stop_signal`` stop every rank after the same step with one checkpoint
(:mod:`ampkit.training.stop`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ampkit import distributed as dist_mod
from ampkit.device import Device, detect_device
from ampkit.device.policy import Precision, bf16_advice
from ampkit.engine.monitor import ScaleMonitor
from ampkit.errors import TrainingHalted, UsageError
from ampkit.tasks import Task
from ampkit.training.callbacks import Callback, TrainState
from ampkit.training.config import TrainConfig
from ampkit.training.loop import batch_to, evaluate, train_loop
from ampkit.training.metrics import MetricsSink
from ampkit.training.resume import resume
from ampkit.training.setup import Run, build_run, make_optimizer
from ampkit.training.record import record_halt, run_record, write_record
from ampkit.training.stop import StopRequest

__all__ = ["TrainConfig", "TrainResult", "train", "make_optimizer", "batch_to", "Callback", "TrainState"]

Progress = Callable[[dict[str, Any]], None]


@dataclass
class TrainResult:
    """What a run did. ``history`` holds every logged metrics record."""

    task: str
    precision: str
    precision_reason: str
    device: str
    steps: int
    start_step: int
    skipped: int
    final_loss: float | None
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    samples_per_s: float | None
    peak_mem_bytes: int | None
    wall_s: float
    out: str | None
    resumed_from: str | None = None
    interrupted_by: str | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    step_graph: bool = False  # the step ran as one replayed device graph (TrainConfig.graph)
    step_graph_fallback: str | None = None  # why it did not (None when it did)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train(config: TrainConfig, *, task: Task | None = None, precision: Precision | None = None,
          progress: Progress | None = None) -> TrainResult:
    """Train ``config.task`` (or ``task``) and return what happened. See :class:`TrainConfig`.

    >>> result = ampkit.train(ampkit.TrainConfig(task="digits", precision="fp32", steps=4, log_every=2))
    >>> result.steps, len(result.history), result.skipped
    (4, 2, 0)
    """
    config.validate()
    device = precision.device if precision is not None else detect_device(config.device)
    # Under torchrun: join the process group; the device becomes this rank's (Device(type, LOCAL_RANK)).
    ctx = dist_mod.init_from_env(device) if dist_mod.launched() else None
    run, finished = None, False
    try:
        run = build_run(config, ctx, device, task=task, precision=precision, progress=progress)
        with cpu_threads(run.device, run.task.cpu_threads):
            result = _train(run, progress, given_task=task is not None)
        finished = True
        return result
    finally:
        if run is not None and run.regions is not None:
            run.regions.remove()  # the task's model leaves as it came
        if run is not None:
            run.amp.close()  # the TF32 switches as they were before the run
        if ctx is not None:
            ctx.close(finished=finished)


@contextlib.contextmanager
def cpu_threads(device: Device, threads: int | None) -> Iterator[None]:
    """Run the body with ``threads`` intra-op threads when ``device`` is the CPU (a task's ``cpu_threads``), and
    give torch's count back after. Nothing changes on an accelerator, for None, or when the user set
    ``OMP_NUM_THREADS`` (their choice wins)."""
    before = torch.get_num_threads()
    if device.is_accelerator or threads is None or "OMP_NUM_THREADS" in os.environ or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(run: Run, progress: Progress | None, *, given_task: bool = False) -> TrainResult:
    start, resumed_from = resume(run)
    if run.config.resume and start > 0 and start >= run.total:
        # Nothing to train: refuse before run.json and metrics.jsonl are touched (they would say --steps N).
        raise UsageError(f"--resume: the run in {run.out} is already at step {start} ({resumed_from}) and --steps "
                         f"{run.total} asks for no step past it: give --steps above {start} to train on; nothing "
                         "was changed")
    record = run_record(run, start=start, given_task=given_task) if run.out is not None else None
    if record is not None and run.main:
        write_record(run.out, record)
    prec, task = run.precision, run.task
    monitor = ScaleMonitor(floor=run.amp.min_scale, advice=bf16_advice(prec)) if prec.use_scaler else None
    sink = MetricsSink(run.out, write=run.main, resumed_at=start, tensorboard=run.config.tensorboard,
                       monitor=monitor, progress=progress if run.main else None)
    stop = StopRequest(run.config.stop_signals(), ctx=run.ctx, check_every=run.config.stop_check_every,
                       device=run.device.torch_device)
    sink.emit({"event": "start", "total": run.total, "start": start, "precision": prec.name,
               "reason": prec.reason, "device": str(run.device), "task": task.name, "notes": list(run.notes)})
    run.device.reset_peak_memory_stats()
    try:
        done = train_loop(run, start, sink, stop)
    except TrainingHalted as exc:
        raise _halted(run, record, exc) from exc
    finally:
        sink.close()
    if done.interrupted_by and run.ctx is not None:
        # torchrun ends the other ranks as soon as one exits with the stop code: let every rank finish first.
        run.ctx.barrier()
    metrics = evaluate(run) if run.config.evaluate and not done.interrupted_by else {}
    final_stats = run.amp.stats() if run.amp.steps else {"skipped": 0}
    return TrainResult(
        task=task.name,
        precision=prec.name,
        precision_reason=prec.reason,
        device=str(run.device),
        steps=done.step,
        start_step=start,
        skipped=int(final_stats["skipped"]),
        final_loss=sink.history[-1]["loss"] if sink.history else None,
        metrics=metrics,
        history=sink.history,
        samples_per_s=sink.mean_samples_per_s(),
        peak_mem_bytes=run.device.max_memory_allocated(),
        wall_s=done.wall_s,
        out=str(run.out) if run.out else None,
        resumed_from=resumed_from,
        interrupted_by=done.interrupted_by,
        notes=run.notes,
        warnings=sink.warnings,
        step_graph=done.graph_captured,
        step_graph_fallback=None if done.graph_captured else (done.graph_fallback or run.graph_blocker),
    )


def _halted(run: Run, record: dict[str, Any] | None, exc: TrainingHalted) -> TrainingHalted:
    """The skip limit's halt, naming the last good checkpoint (kept by rotation: :mod:`ampkit.checkpoint.rotation`)
    and the replay that finds the op; the run record says the same for ``ampkit diagnose --replay``."""
    head = str(exc).split(". Find the cause", 1)[0]
    if run.out is None or record is None:
        return TrainingHalted(f"{head}. Train with --out DIR to keep a record and checkpoints that `ampkit diagnose "
                              "--replay DIR` replays to find the op", step=exc.step, first_bad_step=exc.first_bad_step)
    good = run.ckpts.last_good() if run.ckpts is not None else None
    if good is not None:
        where = f"the last good checkpoint is {good[1]} (step {good[0]}, before the skips began)"
    elif run.ckpts is not None and int(record.get("start_step") or 0) == 0:
        where = ("no checkpoint is from before the skips began, so the replay starts from step 0, which the "
                 "seed rebuilds (--ckpt-every K keeps a checkpoint to start from)")
    else:
        where = "no checkpoint is from before the skips began (--ckpt-every K keeps one)"
    message = (f"{head}; {where}. Find the op with `ampkit diagnose --replay {run.out}`"
               + (" (and try --precision bf16 where the card has it, or a lower learning rate)"
                  if run.precision.use_scaler else " (or try a lower learning rate)"))
    if run.main:
        record_halt(run.out, record, step=exc.step or 0, first_bad_step=exc.first_bad_step, last_good=good,
                    message=message)
    return TrainingHalted(message, step=exc.step, first_bad_step=exc.first_bad_step)
