"""Everything a run is made of, built once from its :class:`~ampkit.training.TrainConfig`: device and
process group, precision, task, model (wrapped for DDP/FSDP2), optimizer, LR scheduler, engine,
checkpoints and callbacks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ampkit.checkpoint import prepare_folder
from ampkit.checkpoint.dcp import RunCheckpoints
from ampkit.device import Device
from ampkit.distributed import DistContext, shard_batch, unwrap, wrap_model
from ampkit.engine import MixedPrecision
from ampkit.errors import UsageError
from ampkit.device.policy import Precision, resolve_precision
from ampkit.engine.regions import FP32Regions
from ampkit.tasks import Task, load_task
from ampkit.training.callbacks import load_callbacks
from ampkit.training.config import TrainConfig
from ampkit.training.record import refuse_existing_run

__all__ = ["Run", "build_run", "make_optimizer"]


@dataclass
class Run:
    """The live objects of one run on this process."""

    config: TrainConfig
    ctx: DistContext | None
    device: Device
    precision: Precision
    task: Task
    total: int
    strategy: str | None
    model: nn.Module  # what trains (DDP/FSDP2-wrapped under torchrun)
    raw_model: nn.Module  # the user's module
    optimizer: torch.optim.Optimizer
    scheduler: Any | None
    amp: MixedPrecision
    ckpts: RunCheckpoints | None
    out: Path | None
    batch: Callable[[int], Any]  # this rank's share of micro-step i's batch, on the CPU
    callbacks: list[Any] = field(default_factory=list)
    regions: FP32Regions | None = None
    notes: list[str] = field(default_factory=list)
    graph_blocker: str | None = "not planned"  # why the step runs eagerly; None: the loop captures it

    @property
    def main(self) -> bool:
        return self.ctx is None or self.ctx.is_main

    @property
    def rank(self) -> int:
        return self.ctx.rank if self.ctx else 0

    @property
    def world_size(self) -> int:
        return self.ctx.world_size if self.ctx else 1


def make_optimizer(model: nn.Module, task: Task, device: Device, *, lr: float | None = None,
                   fused: bool | None = None, capturable: bool = False) -> torch.optim.Optimizer:
    """The task's own optimizer (``task.make_optimizer``), else AdamW, fused where the device supports it
    (the engine then skips non-finite steps on the device); ``capturable`` for a step recorded as a graph."""
    if task.make_optimizer is not None:
        opt = task.make_optimizer(model)
        if not isinstance(opt, torch.optim.Optimizer):
            raise UsageError(f"task {task.name}: make_optimizer returned {type(opt).__name__}, not a torch optimizer")
        if lr is not None:
            for group in opt.param_groups:
                group["lr"] = lr
        return opt
    use_fused = device.supports_fused_optimizer() if fused is None else fused
    kwargs: dict[str, Any] = {"fused": True} if use_fused else {"foreach": True}
    if use_fused and capturable:
        kwargs["capturable"] = True  # step counts stay on the device: what a replayed graph needs
    return torch.optim.AdamW(model.parameters(), lr=lr or task.lr, weight_decay=task.weight_decay, **kwargs)


def _strategy(config: TrainConfig, ctx: DistContext | None, notes: list[str]) -> str | None:
    strategy = config.strategy
    if ctx is not None and strategy is None and ctx.world_size > 1:
        strategy = "ddp"
        notes.append(f"{ctx.world_size} processes and no --strategy: using ddp")
    if ctx is None and strategy is not None:
        notes.append(f"--strategy {strategy} without torchrun: one process"
                     + (", checkpoints in the sharded (dcp) format" if strategy == "fsdp" else ""))
    return strategy


def _batch_fn(task: Task, ctx: DistContext | None) -> Callable[[int], Any]:
    if ctx is None or ctx.world_size == 1:
        return task.batch
    rank, world = ctx.rank, ctx.world_size

    def batch(i: int) -> Any:  # this rank's rows of the global batch
        return shard_batch(task.batch(i), rank, world)

    return batch


def graph_blocker(config: TrainConfig, ctx: DistContext | None, task: Task, callbacks: list[Any],
                  device: Device) -> str | None:
    """Why this run's step cannot be recorded as one device graph, in a few words; None when it can be
    tried (the loop still checks for host syncs in the model before capture and falls back if it finds one)."""
    from ampkit.training.callbacks import Callback

    if config.graph is False:
        return "--no-graph"
    if device.graph_api() is None:
        return f"{device.type} has no device graphs"
    if ctx is not None and ctx.world_size > 1:
        return "several processes (DDP/FSDP2 steps run eagerly)"
    if config.accumulation_steps > 1:
        return "gradient accumulation (--accumulation-steps > 1)"
    if config.weights != "fp32":
        return f"--weights {config.weights} (the step joins and splits the weights; not yet captured as a graph)"
    if not task.graphable:
        return f"task {task.name} says its model cannot be captured (Task.graphable=False)"
    if any(getattr(type(cb), "before_step", Callback.before_step) is not Callback.before_step for cb in callbacks):
        return "a callback runs between backward and the optimizer step (before_step)"
    return None


def _fp8(config: TrainConfig, ctx: DistContext | None, task: Task, model: nn.Module, precision: Precision,
         *, auto: bool, notes: list[str], progress: Any = None) -> Precision:
    """The run's FP8 decision (once, before any wrapper): converts the layers that pay and returns the run's
    precision (``auto`` may become FP8; an explicit fp8 that does not pay is refused). Train steps run eagerly
    (or as a step graph), so the decision is for eager steps: a trial on the model where one process runs on an
    accelerator (:mod:`ampkit.training.fp8_decision`), else the eager cost model."""
    if precision.name != "fp8" and not (auto and precision.name == "bf16"):
        return precision
    from ampkit.engine.fp8 import convert
    from ampkit.engine.fp8_choice import choose_fp8
    from ampkit.training import fp8_decision

    rows = task.tokens_per_batch or task.samples_per_batch
    world = ctx.world_size if ctx is not None else 1
    tokens = max(1, rows // world)
    # Several processes would each probe (or race on the cache) and could decide apart: every rank must
    # convert the same layers, so they all choose by shape, and auto keeps BF16.
    lookup = None if world == 1 else (lambda *_: (None, f"{world} processes decide alike without the cost model"))
    # One process on an accelerator: the layer set is measured on this model (issue 42), the cost model only
    # orders the candidates.
    trial = None if world > 1 else fp8_decision.trial_setup(
        task=task, model=model, precision=precision, device=precision.device, recipe=config.fp8_recipe,
        make_optimizer=lambda m: make_optimizer(m, task, precision.device, lr=config.lr, fused=config.fused),
        max_grad_norm=config.max_grad_norm, progress=progress)
    choice = choose_fp8(model, precision, auto=auto, recipe=config.fp8_recipe, tokens=tokens, mode="eager",
                        layers=config.fp8_layers, lookup=lookup, trial=trial)
    if choice.report is not None:
        # torchao's Float8Linear in place of the chosen nn.Linear layers (same Parameters).
        convert(model, chosen=choice.report)
    if choice.note:
        notes.append(choice.note)
    return choice.precision


def build_run(config: TrainConfig, ctx: DistContext | None, device: Device, *, task: Task | None,
              precision: Precision | None, progress: Any = None) -> Run:
    if ctx is not None:
        device = ctx.device
        if precision is not None and precision.device != device:
            precision = dataclasses.replace(precision, device=device)
    out = Path(config.out) if config.out else None
    if out is not None:  # every rank: a refusal must not leave the others waiting at the barrier
        refuse_existing_run(out, resume=config.resume or (ctx is not None and ctx.restart_count > 0))
    if (ctx is None or ctx.is_main) and out is not None:
        prepare_folder(out)
    if ctx is not None:
        ctx.barrier()  # rank 0 made --out
    auto = precision is None and config.precision == "auto"  # only ampkit's own auto may turn into FP8
    precision = precision or resolve_precision(config.precision, device, tf32=config.tf32)
    device.manual_seed(config.seed)
    task = task or load_task(config.task, seed=config.seed, options=config.task_options,
                             device=device.torch_device)
    callbacks = load_callbacks(config.callbacks)
    total = config.steps or task.default_steps
    notes: list[str] = []
    strategy = _strategy(config, ctx, notes)
    model = task.model.to(device.torch_device)
    precision = _fp8(config, ctx, task, model, precision, auto=auto, notes=notes,
                     progress=progress if ctx is None or ctx.is_main else None)
    if config.fp32_modules and ctx is not None and strategy == "fsdp" and precision.is_low_precision:
        raise UsageError("--fp32-modules with --strategy fsdp is not supported yet (FSDP2 gathers every weight in "
                         f"{precision.name}, so an FP32 region would meet low-precision weights): use --strategy ddp")
    if config.weights != "fp32" and ctx is not None and ctx.world_size > 1:
        raise UsageError(f"--weights {config.weights} runs in one process for now (DDP and FSDP2 gather and reduce "
                         "the weights they were given): drop --weights or run one process")
    if ctx is not None and strategy is not None:
        model = wrap_model(model, strategy, precision, device, shard_fn=task.extra.get("shard"))
    blocker = graph_blocker(config, ctx, task, callbacks, device)
    optimizer = make_optimizer(model, task, device, lr=config.lr, fused=config.fused, capturable=blocker is None)
    scheduler = task.make_scheduler(optimizer, total) if task.make_scheduler is not None else None
    if blocker is None and scheduler is not None:
        blocker = "an LR scheduler changes the learning rate on the host between steps"
    amp = MixedPrecision(precision, config=config.amp_config(), agree=ctx.agree if ctx is not None else None,
                         graph=blocker is None)
    regions = amp.attach(unwrap(model))  # the engine's fp32_modules: its state_dict records them
    if regions is not None:
        notes.append(f"FP32 regions: {', '.join(regions.names)}")
    if blocker is not None and blocker != "--no-graph" and (device.graph_api() is not None or config.graph):
        notes.append(f"eager steps, no step graph: {blocker}")
    ckpts = None
    if out is not None:
        ckpts = RunCheckpoints(out / "checkpoints", keep=config.keep, ctx=ctx, sharded=strategy == "fsdp")
    return Run(config=config, ctx=ctx, device=device, precision=precision, task=task, total=total,
               strategy=strategy, model=model, raw_model=unwrap(model), optimizer=optimizer, scheduler=scheduler,
               amp=amp, ckpts=ckpts, out=out, batch=_batch_fn(task, ctx), callbacks=callbacks, regions=regions, notes=notes,
               graph_blocker=blocker)
