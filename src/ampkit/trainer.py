"""The training loop: engine step, metrics, checkpoints, resume, clean stop on SIGINT/SIGTERM.

>>> from ampkit.trainer import TrainConfig, train
>>> result = train(TrainConfig(task="digits", precision="bf16", steps=200, out="runs/digits"))  # doctest: +SKIP
>>> result.metrics["accuracy"]                                                                     # doctest: +SKIP
0.97

Nothing here prints: progress goes to the ``progress`` callback (the CLI draws a bar with it).

Under torchrun (``ampkit train --nproc N``, or ``torchrun -m ampkit train``) the same loop runs on every
rank with ``strategy="ddp" | "fsdp"``: see :mod:`ampkit.distributed`. Only rank 0 reports and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ampkit import distributed as dist_mod
from ampkit.checkpoint import CheckpointManager, prepare_folder, restore
from ampkit.device import Device, detect_device
from ampkit.engine import MixedPrecision
from ampkit.errors import UsageError
from ampkit.monitor import ScaleMonitor
from ampkit.policy import Precision, resolve_precision
from ampkit.tasks import Task, load_task

__all__ = ["TrainConfig", "TrainResult", "train", "make_optimizer", "batch_to"]

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run depends on. ``steps`` is the run's total number of optimizer steps.

    >>> cfg = ampkit.TrainConfig(task="digits", precision="bf16", steps=100, out="runs/d", ckpt_every=50)
    >>> cfg.log_every, cfg.keep
    (10, 3)
    """

    task: str = "digits"
    task_options: dict[str, Any] = field(default_factory=dict)
    precision: str = "auto"
    steps: int | None = None  # None: the task's default
    seed: int = 0
    out: str | None = None
    ckpt_every: int | None = None
    keep: int = 3
    log_every: int = 10
    resume: bool = False
    max_grad_norm: float | None = 1.0
    accumulation_steps: int = 1
    lr: float | None = None
    device: str | None = None
    fused: bool | None = None  # None: fused where the device has it
    tf32: bool | None = None
    tensorboard: bool = False
    evaluate: bool = True
    max_consecutive_skips: int | None = 50
    # "ddp" | "fsdp" under torchrun (see ampkit.distributed); None: DDP when torchrun starts more than
    # one process. Without torchrun a strategy runs one process (fsdp: in the sharded checkpoint format).
    strategy: str | None = None

    def validate(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be a positive number of optimizer steps, got {self.steps}")
        for name in ("log_every", "accumulation_steps", "keep"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.ckpt_every is not None and self.ckpt_every < 1:
            raise UsageError(f"--ckpt-every must be >= 1, got {self.ckpt_every}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if (self.resume or self.ckpt_every) and not self.out:
            raise UsageError("--resume and --ckpt-every need --out DIR (where checkpoints live)")
        if self.strategy is not None and self.strategy not in dist_mod.STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(dist_mod.STRATEGIES)}, got {self.strategy!r}")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_optimizer(model: torch.nn.Module, task: Task, device: Device, *, lr: float | None = None,
                   fused: bool | None = None) -> torch.optim.Optimizer:
    """AdamW, fused where the device supports it (the engine then skips non-finite steps on the device)."""
    use_fused = device.supports_fused_optimizer() if fused is None else fused
    kwargs: dict[str, Any] = {"fused": True} if use_fused else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=lr or task.lr, weight_decay=task.weight_decay, **kwargs)


def batch_to(batch: tuple[torch.Tensor, ...], device: Device) -> tuple[torch.Tensor, ...]:
    dev = device.torch_device
    return tuple(t.to(dev, non_blocking=True) for t in batch)


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the end of the current step."""

    def __init__(self) -> None:
        self.signal: str | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator["_StopFlag"]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {}

        def handler(signum: int, _frame: Any) -> None:
            if self.signal is not None:  # a second Ctrl-C: stop now
                signal.signal(signum, previous.get(signum, signal.SIG_DFL))
                raise KeyboardInterrupt
            self.signal = signal.Signals(signum).name

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def _metrics_writer(out: Path | None, resume: bool) -> Any:
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    return open(out / "metrics.jsonl", "a" if resume else "w", encoding="utf-8")


def _tensorboard(out: Path | None, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UsageError("--tensorboard needs the tensorboard package: pip install 'ampkit[tensorboard]'") from exc
    return SummaryWriter(log_dir=str((out or Path("runs")) / "tensorboard"))


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
    try:
        return _train(config, ctx, device, task=task, precision=precision, progress=progress)
    finally:
        if ctx is not None:
            ctx.close()


def _train(config: TrainConfig, ctx: dist_mod.DistContext | None, device: Device, *, task: Task | None,
           precision: Precision | None, progress: Progress | None) -> TrainResult:
    main = ctx is None or ctx.is_main
    if ctx is not None:
        device = ctx.device
        if precision is not None and precision.device != device:
            precision = dataclasses.replace(precision, device=device)
    out = Path(config.out) if config.out else None
    if main and out is not None:
        prepare_folder(out)
    if ctx is not None:
        ctx.barrier()  # rank 0 made --out
    precision = precision or resolve_precision(config.precision, device, tf32=config.tf32)
    device.manual_seed(config.seed)
    task = task or load_task(config.task, seed=config.seed, options=config.task_options)
    total = config.steps or task.default_steps
    notes: list[str] = []
    strategy = config.strategy
    if ctx is not None and strategy is None and ctx.world_size > 1:
        strategy = "ddp"
        notes.append(f"{ctx.world_size} processes and no --strategy: using ddp")
    if ctx is None and strategy is not None:
        notes.append(f"--strategy {strategy} without torchrun: one process"
                     + (", checkpoints in the sharded (dcp) format" if strategy == "fsdp" else ""))
    batch_fn = task.batch
    if ctx is not None and ctx.world_size > 1:
        rank, world = ctx.rank, ctx.world_size

        def batch_fn(i: int) -> tuple[torch.Tensor, ...]:  # this rank's rows of the global batch
            return dist_mod.shard_batch(task.batch(i), rank, world)

    model = task.model.to(device.torch_device)
    if ctx is not None and strategy is not None:
        model = dist_mod.wrap_model(model, strategy, precision, device, shard_fn=task.extra.get("shard"))
    raw_model = dist_mod.unwrap(model)
    optimizer = make_optimizer(model, task, device, lr=config.lr, fused=config.fused)
    amp = MixedPrecision(precision, max_grad_norm=config.max_grad_norm,
                         accumulation_steps=config.accumulation_steps,
                         max_consecutive_skips=config.max_consecutive_skips,
                         agree=ctx.agree if ctx is not None else None)
    distributed = ctx is not None or strategy is not None
    ckpts: Any = None
    if out is not None:
        if distributed:
            ckpts = dist_mod.RunCheckpoints(out / "checkpoints", keep=config.keep, ctx=ctx, sharded=strategy == "fsdp")
        else:
            ckpts = CheckpointManager(out / "checkpoints", keep=config.keep)
    hooks = dist_mod.TestHooks.from_env(ctx.rank if ctx else 0, ctx.world_size if ctx else 1, out)
    start, resumed_from = 0, None
    resume = config.resume
    if ctx is not None and ctx.restart_count > 0 and ckpts is not None and not resume:
        resume = True  # torchrun restarted the job (--max-restarts): continue from the last checkpoint
        notes.append(f"torchrun restart {ctx.restart_count}: resuming from the last checkpoint")
    if resume and ckpts is not None and distributed:
        start, path, more = ckpts.restore_latest(model=model, optimizer=optimizer, amp=amp, device=device)
        notes += more
        if path is None:
            notes.append(f"no checkpoint in {ckpts.folder}: starting from scratch")
        else:
            resumed_from = str(path)
            notes.append(f"resumed from {path} at step {start}")
    elif resume and ckpts is not None:
        found = ckpts.latest(map_location=device.torch_device)
        for path, why in found.skipped:
            notes.append(f"skipped unreadable checkpoint: {why}")
        if found.state is None:
            notes.append(f"no checkpoint in {ckpts.folder}: starting from scratch")
        else:
            notes += restore(found.state, model=model, optimizer=optimizer, amp=amp, device=device)
            start, resumed_from = int(found.state["step"]), str(found.path)
            notes.append(f"resumed from {found.path} at step {start}")
    emit = (progress if main else None) or (lambda record: None)
    monitor = ScaleMonitor(floor=amp.min_scale) if precision.use_scaler else None
    history: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    if main and out is not None and start > 0:
        # A run killed after its last checkpoint logged steps that it will now train again.
        dist_mod.truncate_metrics(out / "metrics.jsonl", start)
    writer = _metrics_writer(out, resume=resume and start > 0) if main else None
    tb = _tensorboard(out, config.tensorboard) if main else None
    reduce = ctx.reduce_sum if ctx is not None and ctx.world_size > 1 else None
    stop = _StopFlag()
    # [sum of finite losses, number of finite losses] since the last log, kept on the device.
    loss_sum = torch.zeros(2, dtype=torch.float32, device=device.torch_device)
    window_count = 0
    samples_per_step = task.samples_per_batch * config.accumulation_steps
    emit({"event": "start", "total": total, "start": start, "precision": precision.name,
          "reason": precision.reason, "device": str(device), "task": task.name, "notes": list(notes)})
    device.reset_peak_memory_stats()
    t_run = t_window = time.perf_counter()
    step = start
    sps_all: list[float] = []
    model.train()
    # Distributed: no graceful-stop handler. Ranks would stop at different steps and wait on each other
    # in the final checkpoint's collectives; a signal ends the process and the job resumes from the last
    # --ckpt-every checkpoint (torchrun --max-restarts, or --resume).
    installed = stop.installed() if ctx is None else contextlib.nullcontext(stop)

    def save_checkpoint() -> None:
        ckpts.save(step=step, model=model, optimizer=optimizer, amp=amp, device=device,
                   extra={"task": task.name, "seed": config.seed})

    try:
        with installed:
            while step < total:
                for micro in range(config.accumulation_steps):
                    batch = batch_to(batch_fn(step * config.accumulation_steps + micro), device)
                    with amp.no_sync(model), amp.autocast():
                        loss = task.loss(model, batch)
                    with amp.no_sync(model):
                        amp.backward(loss)
                    lv = loss.detach().float()
                    finite = torch.isfinite(lv)
                    loss_sum[0] += torch.where(finite, lv, torch.zeros_like(lv))
                    loss_sum[1] += finite.float()
                    window_count += 1
                    if micro < config.accumulation_steps - 1:
                        amp.step(optimizer)  # an accumulation micro-step: counts it, updates nothing
                if hooks is not None:
                    hooks.before_step(step + 1, model)
                amp.step(optimizer)
                step += 1
                if hooks is not None:
                    hooks.after_step(step)
                if step % config.log_every == 0 or step == total or stop.signal:
                    record = _log_record(amp, loss_sum, window_count, step, samples_per_step, t_window, device,
                                         reduce=reduce)
                    loss_sum.zero_()
                    window_count = 0
                    t_window = time.perf_counter()
                    record["precision"] = precision.name
                    if record["samples_per_s"]:
                        sps_all.append(record["samples_per_s"])
                    history.append(record)
                    if writer is not None:
                        writer.write(json.dumps(record) + "\n")
                        writer.flush()
                    if tb is not None:
                        for key in ("loss", "scale", "grad_norm", "samples_per_s", "skipped"):
                            if record.get(key) is not None:
                                tb.add_scalar(key, record[key], step)
                    if monitor is not None:
                        warn = monitor.update(step, record["scale"], record["skipped"])
                        if warn is not None:
                            warnings.append(asdict(warn))
                            emit({"event": "warning", **asdict(warn)})
                    emit({"event": "log", **record})
                if ckpts is not None and ((config.ckpt_every and step % config.ckpt_every == 0) or stop.signal):
                    save_checkpoint()
                    emit({"event": "checkpoint", "step": step})
                if stop.signal:
                    break
            if ckpts is not None and not stop.signal:
                saved = ckpts.list()
                if not saved or saved[-1][0] != step:
                    save_checkpoint()
    finally:
        if writer is not None:
            writer.close()
        if tb is not None:
            tb.close()
    wall = time.perf_counter() - t_run
    if hooks is not None:
        hooks.finish(model, optimizer, amp)
    metrics: dict[str, float] = {}
    if config.evaluate and task.evaluate is not None and not stop.signal:
        # Every rank evaluates (FSDP2's forward gathers shards collectively); DDP's own module needs no sync.
        metrics = evaluate(task, raw_model if strategy == "ddp" else model, amp, device)
    final_stats = amp.stats() if amp.steps else {"skipped": 0}
    return TrainResult(
        task=task.name,
        precision=precision.name,
        precision_reason=precision.reason,
        device=str(device),
        steps=step,
        start_step=start,
        skipped=int(final_stats["skipped"]),
        final_loss=history[-1]["loss"] if history else None,
        metrics=metrics,
        history=history,
        samples_per_s=(sum(sps_all[1:]) / len(sps_all[1:])) if len(sps_all) > 1 else (sps_all[0] if sps_all else None),
        peak_mem_bytes=device.max_memory_allocated(),
        wall_s=wall,
        out=str(out) if out else None,
        resumed_from=resumed_from,
        interrupted_by=stop.signal,
        notes=notes,
        warnings=warnings,
    )


def evaluate(task: Task, model: torch.nn.Module, amp: MixedPrecision, device: Device) -> dict[str, float]:
    """The task's evaluation, in the run's precision, without gradients."""
    if task.evaluate is None:
        return {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), amp.autocast():
            return {k: float(v) for k, v in task.evaluate(model, device.torch_device).items()}
    finally:
        model.train(was_training)


def _log_record(amp: MixedPrecision, loss_sum: torch.Tensor, count: int, step: int, samples_per_step: int,
                t_window: float, device: Device,
                reduce: Callable[[list[float]], list[float]] | None = None) -> dict[str, Any]:
    stats = amp.stats()  # the host reads of this log step
    total, n_finite = loss_sum.tolist()
    steps_in_window = max(count // max(amp.accumulation_steps, 1), 1)
    skipped, extra = stats["skipped"], {}
    if reduce is not None:
        # One all_reduce per log step: the loss is the mean over every rank's share of the global batch
        # (equal shares: the single-process loss); skip counts agree, and the sum checks that they do.
        total, n_finite, count_all, skipped_sum, world_f = reduce([total, n_finite, float(count),
                                                                   float(stats["skipped"]), 1.0])
        world = round(world_f)
        count = round(count_all)
        extra = {"ranks": world}
        if round(skipped_sum) != stats["skipped"] * world:
            extra["skip_disagreement"] = True
    loss = total / n_finite if n_finite else float("nan")
    dt = time.perf_counter() - t_window
    return {
        "step": step,
        "loss": loss if math.isfinite(loss) else None,
        "nonfinite_losses": count - int(n_finite),
        "scale": stats["scale"],
        "skipped": skipped,
        "consecutive_skips": stats["consecutive_skips"],
        "grad_norm": stats["grad_norm"] if stats["grad_norm"] is not None and math.isfinite(stats["grad_norm"]) else None,
        "samples_per_s": (samples_per_step * steps_in_window / dt) if dt > 0 else None,
        "peak_mem_bytes": device.max_memory_allocated(),
        "time": time.time(),
        **extra,
    }
