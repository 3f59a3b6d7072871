"""The training loop: micro-batches through the engine, one optimizer step, callbacks, metrics,
checkpoints, and the agreed stop. It reads the device only on log steps (metrics) and, with several
ranks, every ``stop_check_every`` steps (the stop flag)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ampkit.device import Device
from ampkit.tasks import map_tensors
from ampkit.training.callbacks import TrainState, call
from ampkit.training.metrics import LossWindow, MetricsSink, log_record
from ampkit.training.setup import Run
from ampkit.training.stop import StopRequest

__all__ = ["train_loop", "LoopResult", "batch_to"]


@dataclass
class LoopResult:
    step: int  # optimizer steps done (the run's position)
    interrupted_by: str | None  # the agreed signal's name when a signal stopped the run
    wall_s: float
    graph_captured: bool = False  # the step ran as one replayed device graph
    graph_fallback: str | None = None  # why a step planned as a graph ran eagerly (the warm-up check)


def batch_to(batch: Any, device: Device) -> Any:
    """A batch (tensor, or tuples / lists / dicts of them, nested) on ``device``; other values unchanged."""
    dev = device.torch_device
    return map_tensors(batch, lambda t: t.to(dev, non_blocking=True))


def _step(run: Run) -> None:
    """The engine's optimizer step; it advances the scheduler only where the step was applied (a skipped
    step leaves the schedule where it was, without a host read where the optimizer is fused)."""
    run.amp.step(run.optimizer, scheduler=run.scheduler)


def _lr(optimizer: torch.optim.Optimizer) -> float | None:
    """The first parameter group's learning rate (a tensor lr is read here, on a log step)."""
    lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
    return float(lr) if lr is not None else None


def _save(run: Run, step: int) -> None:
    run.ckpts.save(step=step, model=run.model, optimizer=run.optimizer, amp=run.amp, device=run.device,
                   scheduler=run.scheduler, extra={"task": run.task.name, "seed": run.config.seed})


def _graphed(run: Run, batch: Any) -> Any:
    """The whole step as one replayable device graph (:meth:`MixedPrecision.graph_step`), built on the first
    batch; it runs a few eager warm-up steps (they are training steps), then captures, then replays."""
    return run.amp.graph_step(run.model, run.optimizer, run.task.loss, batch)


def train_loop(run: Run, start: int, sink: MetricsSink, stop: StopRequest) -> LoopResult:
    cfg, amp, model = run.config, run.amp, run.model
    acc = cfg.accumulation_steps
    samples_per_step = run.task.samples_per_batch * acc
    reduce = run.ctx.reduce_sum if run.world_size > 1 else None
    window = LossWindow(run.device.torch_device)
    state = TrainState(step=start, total=run.total, rank=run.rank, world_size=run.world_size, out=run.out,
                       model=model, optimizer=run.optimizer, amp=amp, scheduler=run.scheduler)
    call(run.callbacks, "on_start", state)
    t_run = time.perf_counter()
    step = start
    model.train()
    gstep = None
    with stop.installed():
        while step < run.total:
            if run.graph_blocker is None:
                batch = batch_to(run.batch(step), run.device)
                if gstep is None:
                    gstep = _graphed(run, batch)
                window.add(gstep(batch))  # the graph's output is overwritten by the next replay: added now
            for micro in range(acc if run.graph_blocker is not None else 0):
                batch = batch_to(run.batch(step * acc + micro), run.device)
                with amp.no_sync(model), amp.autocast():
                    loss = run.task.loss(model, batch)
                with amp.no_sync(model):
                    amp.backward(loss)
                window.add(loss)
                if micro < acc - 1:
                    amp.step(run.optimizer)  # an accumulation micro-step: counts it, updates nothing
            if run.graph_blocker is not None:
                call(run.callbacks, "before_step", state)
                _step(run)
            step = state.step = step + 1
            call(run.callbacks, "after_step", state)
            stopping = stop.should_stop(step)
            if step % cfg.log_every == 0 or step == run.total or stopping:
                record = log_record(amp, window, step, samples_per_step, run.device.max_memory_allocated(), reduce)
                record["precision"] = run.precision.name
                record["lr"] = _lr(run.optimizer)
                window.reset()
                sink.add(record)
            if run.ckpts is not None and ((cfg.ckpt_every and step % cfg.ckpt_every == 0) or stopping):
                _save(run, step)
                sink.emit({"event": "checkpoint", "step": step})
            if stopping:
                break
        if run.ckpts is not None and not stop.agreed:
            saved = run.ckpts.list()
            if not saved or saved[-1][0] != step:
                _save(run, step)
    if gstep is not None:
        run.notes.append("the whole step ran as one device graph (after warm-up)" if gstep.captured
                         else f"eager steps, no step graph: {gstep.fallback_reason}")
    wall = time.perf_counter() - t_run
    state.stop = stop.name
    call(run.callbacks, "on_end", state)
    return LoopResult(step=step, interrupted_by=stop.name, wall_s=wall,
                      graph_captured=gstep is not None and gstep.captured,
                      graph_fallback=gstep.fallback_reason if gstep is not None and not gstep.captured else None)


def evaluate(run: Run) -> dict[str, float]:
    """The task's evaluation, in the run's precision, without gradients. Every rank evaluates (FSDP2's
    forward gathers shards collectively); DDP's own module needs no collective."""
    task = run.task
    if task.evaluate is None:
        return {}
    model = run.raw_model if run.strategy == "ddp" else run.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), run.amp.autocast():
            return {k: float(v) for k, v in task.evaluate(model, run.device.torch_device).items()}
    finally:
        model.train(was_training)
