"""The trainer: ``train(TrainConfig(...))`` runs setup, resume, the loop and evaluation, and returns
what happened. The parts live in :mod:`ampkit.training` (setup, resume, loop, metrics, stop, callbacks).

>>> from ampkit.trainer import TrainConfig, train
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

import math
import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ampkit import distributed as dist_mod
from ampkit.choices import FP8_RECIPES
from ampkit.config import AmpConfig
from ampkit.device import detect_device
from ampkit.errors import UsageError
from ampkit.monitor import ScaleMonitor
from ampkit.policy import Precision, bf16_advice
from ampkit.regions import normalize_fp32_modules
from ampkit.tasks import Task
from ampkit.training.callbacks import Callback, TrainState
from ampkit.training.loop import batch_to, evaluate, train_loop
from ampkit.training.metrics import MetricsSink
from ampkit.training.resume import resume
from ampkit.training.setup import Run, build_run, make_optimizer
from ampkit.training.stop import StopRequest, parse_signal

__all__ = ["TrainConfig", "TrainResult", "train", "make_optimizer", "batch_to", "Callback", "TrainState"]

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run depends on. ``steps`` is the run's total number of optimizer steps.

    ``callbacks``: :class:`~ampkit.training.callbacks.Callback` objects, or ``FILE.py:factory`` /
    ``module:factory`` specs (what ``--callback`` passes; under torchrun each rank builds its own).
    ``stop_signal``: a signal that stops the run like SIGTERM (e.g. ``"SIGUSR1"``, a scheduler's warning).
    ``stop_check_every``: with several ranks, how often (in steps) they agree on a stop: one small
    all_reduce and one host read every N steps; a stop takes effect at most N steps after the signal.
    ``init_scale``: the FP16 loss scaler's initial scale (default 65536).
    ``graph``: capture the whole training step (forward, backward, clip, optimizer, scaler) as one device
    graph where it can (CUDA graphs; MUSA graphs from QY2 on). None (the default): wherever possible, and
    one note says why not where it is not; False: eager steps (``--no-graph``). Losses, skips, metrics,
    checkpoints and resume are the same either way.
    ``fp32_modules``: modules kept in FP32 under autocast (names, globs such as ``"*.norm"``, module
    types, presets such as ``"preset:norm"``; a comma-separated string too): see :mod:`ampkit.regions`.

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
    init_scale: float | None = None
    fp32_modules: Any = None
    callbacks: tuple[Any, ...] = ()
    stop_signal: str | None = None
    stop_check_every: int = 10
    graph: bool | None = None
    fp8_recipe: str = "tensorwise"  # with precision "fp8": torchao's "tensorwise" or "rowwise" scaling

    def validate(self) -> None:
        if self.fp8_recipe not in FP8_RECIPES:
            raise UsageError(f"fp8_recipe must be 'tensorwise' or 'rowwise', got {self.fp8_recipe!r}")
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
        if self.init_scale is not None and not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise UsageError(f"--init-scale must be a positive number, got {self.init_scale}")
        if self.stop_check_every < 1:
            raise UsageError(f"--stop-check-every must be >= 1, got {self.stop_check_every}")
        self.stop_signals()
        normalize_fp32_modules(self.fp32_modules)
        self.amp_config()  # the engine's own checks (e.g. --max-grad-norm nan), before any process starts

    def amp_config(self) -> AmpConfig:
        """The engine's settings for this run (its ``fp32_modules`` are installed with ``amp.attach(model)``)."""
        changes: dict[str, Any] = {"max_grad_norm": self.max_grad_norm, "accumulation_steps": self.accumulation_steps,
                                   "max_consecutive_skips": self.max_consecutive_skips}
        if self.fp32_modules:
            changes["fp32_modules"] = self.fp32_modules
        if self.init_scale is not None:
            changes["init_scale"] = self.init_scale
        return AmpConfig(**changes)

    def stop_signals(self) -> tuple[int, ...]:
        """The signal numbers that stop the run gracefully: SIGINT, SIGTERM and ``stop_signal``."""
        extra = (int(parse_signal(self.stop_signal)),) if self.stop_signal else ()
        return tuple(dict.fromkeys((int(signal.SIGINT), int(signal.SIGTERM), *extra)))


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
    run = None
    try:
        run = build_run(config, ctx, device, task=task, precision=precision)
        return _train(run, progress)
    finally:
        if run is not None and run.regions is not None:
            run.regions.remove()  # the task's model leaves as it came
        if run is not None:
            run.amp.close()  # the TF32 switches as they were before the run
        if ctx is not None:
            ctx.close()


def _train(run: Run, progress: Progress | None) -> TrainResult:
    start, resumed_from = resume(run)
    prec, task = run.precision, run.task
    monitor = ScaleMonitor(floor=run.amp.min_scale, advice=bf16_advice(run.device)) if prec.use_scaler else None
    sink = MetricsSink(run.out, write=run.main, resumed_at=start, tensorboard=run.config.tensorboard,
                       monitor=monitor, progress=progress if run.main else None)
    stop = StopRequest(run.config.stop_signals(), ctx=run.ctx, check_every=run.config.stop_check_every,
                       device=run.device.torch_device)
    sink.emit({"event": "start", "total": run.total, "start": start, "precision": prec.name,
               "reason": prec.reason, "device": str(run.device), "task": task.name, "notes": list(run.notes)})
    run.device.reset_peak_memory_stats()
    try:
        done = train_loop(run, start, sink, stop)
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
