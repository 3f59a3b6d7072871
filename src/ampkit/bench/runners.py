"""The training loops ``ampkit bench`` times, one per runner, all on the same model and batches.

* ``plain``: the hand-written torch loop, the baseline for the engine's overhead: autocast,
  ``GradScaler(enabled=fp16)``, ``unscale_``, ``clip_grad_norm_``, ``scaler.step``, ``update``,
  fused AdamW. It is sync-free too (torch passes the found-inf flag to fused optimizers).
* ``ampkit``: the same step through :class:`ampkit.MixedPrecision` (on-device skip counters added).
* ``ampkit-graph``: ``MixedPrecision(graph=True).graph_step`` with the fused capturable optimizer; with
  ``--compile`` the compiled forward and backward are captured into the same one-launch step.
* ``lesson``: the lesson's full loop (section 5): host-side ``if not torch.isfinite(loss)`` every
  step and the default (non-fused) AdamW, then unscale, clip, step, update.
* ``accelerate`` / ``fabric``: the same step through Hugging Face Accelerate and Lightning Fabric,
  each only when installed; a configuration a peer refuses is recorded with its message.

Every runner clips the gradient norm at ``max_grad_norm`` and uses the workload's optimizer (AdamW with
the workload's lr unless the workload names another, e.g. SGD with momentum for ResNet-50).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ampkit.device import Device
from ampkit.device.policy import Precision

from ampkit.bench.ran_as import AutocastProbe, check_ran
from ampkit.choices import BENCH_PEERS, BENCH_RUNNERS  # noqa: E402

__all__ = ["RUNNERS", "PEERS", "Ctx", "Built", "Refused", "Unavailable", "build"]

PEERS = BENCH_PEERS
RUNNERS = BENCH_RUNNERS

Step = Callable[[tuple[torch.Tensor, ...]], torch.Tensor]


class Refused(Exception):
    """A peer library refuses this configuration (its message is recorded)."""


class Unavailable(Exception):
    """The runner cannot run here (library not installed, device not supported by it)."""


@dataclass(kw_only=True)
class Ctx:
    model: nn.Module
    loss: Callable[[nn.Module, Any], torch.Tensor]
    forward: Callable[[tuple[torch.Tensor, ...]], torch.Tensor]  # the loss, compiled or not
    example_batch: tuple[torch.Tensor, ...]
    precision: Precision
    device: Device
    optimizer: Callable[..., torch.optim.Optimizer]  # optimizer(params, **flags): the workload's
    max_grad_norm: float
    compiled: bool


@dataclass(kw_only=True)
class Built:
    step: Step
    extra_warmup: int = 0  # steps the runner needs before it is in steady state (graph capture)
    finish: Callable[[], dict[str, Any]] | None = None  # details read after timing
    cleanup: Callable[[], None] | None = None


def _optimizer(ctx: Ctx, **flags: Any) -> torch.optim.Optimizer:
    return ctx.optimizer(ctx.model.parameters(), **flags)


def _fused(ctx: Ctx) -> dict[str, Any]:
    return {"fused": True} if ctx.device.supports_fused_optimizer() else {}


def _plain(ctx: Ctx) -> Built:
    prec, dev = ctx.precision, ctx.device
    params = list(ctx.model.parameters())
    opt = _optimizer(ctx, **_fused(ctx))
    scaler = dev.grad_scaler(enabled=prec.use_scaler)  # branch-free: a disabled scaler passes through
    fwd, max_norm = ctx.forward, ctx.max_grad_norm

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with torch.autocast(device_type=dev.type, dtype=prec.dtype, enabled=prec.autocast_enabled):
            loss = fwd(b)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return Built(step=step)


def _ampkit(ctx: Ctx) -> Built:
    from ampkit.engine import MixedPrecision

    amp = MixedPrecision(ctx.precision, max_grad_norm=ctx.max_grad_norm, device=ctx.device)
    opt = _optimizer(ctx, **_fused(ctx))
    fwd = ctx.forward

    def loss_fn(_model: Any, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return fwd(b)  # the (maybe compiled) model + loss

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return amp.train_step(ctx.model, loss_fn, [b], opt)[0]  # the engine's one eager step

    def finish() -> dict[str, Any]:
        s = amp.stats()
        return {"skipped": s["skipped"], "scale": s["scale"], "host_sync_by_design": amp.uses_host_sync(opt)}

    return Built(step=step, finish=finish)


def _ampkit_graph(ctx: Ctx) -> Built:
    from ampkit.engine import MixedPrecision

    amp = MixedPrecision(ctx.precision, max_grad_norm=ctx.max_grad_norm, device=ctx.device, graph=True)
    # Compiled: the inductor kernels of the forward and backward are recorded into the same graph as the
    # clip and the fused optimizer (one launch per step), instead of torch.compile's own cudagraphs.
    loss_fn = (lambda model, b, fwd=ctx.forward: fwd(b)) if ctx.compiled else ctx.loss
    capturable = {"fused": True, "capturable": True} if ctx.device.graph_api() is not None else _fused(ctx)
    opt = _optimizer(ctx, **capturable)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback reason is recorded in the row instead
        gstep = amp.graph_step(ctx.model, opt, loss_fn, ctx.example_batch)

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return gstep(b)

    def finish() -> dict[str, Any]:
        s = amp.stats()
        return {"skipped": s["skipped"], "scale": s["scale"], "graph_captured": gstep.captured,
                "graph_fallback": gstep.fallback_reason}

    return Built(step=step, extra_warmup=gstep.warmup + 1, finish=finish)


def _lesson(ctx: Ctx) -> Built:
    prec, dev = ctx.precision, ctx.device
    params = list(ctx.model.parameters())
    opt = _optimizer(ctx)  # the lesson's torch.optim.AdamW(model.parameters(), lr=1e-3): not fused
    scaler = dev.grad_scaler(enabled=prec.use_scaler)
    fwd, max_norm = ctx.forward, ctx.max_grad_norm

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=prec.dtype, enabled=prec.autocast_enabled):
            loss = fwd(b)
        if not torch.isfinite(loss):  # the lesson's host-side check: one sync every step
            return loss.detach()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return Built(step=step)


@contextlib.contextmanager
def _quiet():
    """Peers print banners on stdout; ``ampkit bench --json`` keeps stdout for JSON alone."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _accelerate(ctx: Ctx) -> Built:
    if ctx.compiled:
        raise Unavailable("peers are measured eager")
    try:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
    except ImportError:
        raise Unavailable("accelerate is not installed") from None
    if ctx.device.is_accelerator and not ctx.device.is_cuda:  # the peers' own device support is what limits this
        raise Unavailable(f"not run on {ctx.device.type} here")
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[ctx.precision.name]
    with _quiet():
        for state in (AcceleratorState, GradientState):
            with contextlib.suppress(Exception):
                state._reset_state()  # one Accelerator per configuration in one process
        try:
            acc = Accelerator(mixed_precision=mixed, cpu=not ctx.device.is_accelerator)
        except Exception as exc:  # noqa: BLE001 - its refusal is the result
            raise Refused(_msg(exc)) from exc
        keys = set(vars(ctx.model))
        opt = _optimizer(ctx, **_fused(ctx))
        model, opt = acc.prepare(ctx.model, opt)
    loss_fn, max_norm = ctx.loss, ctx.max_grad_norm

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loss = loss_fn(model, b)  # Accelerate's wrapped forward runs autocast (and returns FP32 outputs)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def cleanup() -> None:
        # prepare() replaced model.forward on the instance; put the class's forward back for later runners.
        for key in set(vars(ctx.model)) - keys:
            with contextlib.suppress(Exception):
                delattr(ctx.model, key)

    return Built(step=step, cleanup=cleanup)


def _fabric(ctx: Ctx) -> Built:
    if ctx.compiled:
        raise Unavailable("peers are measured eager")
    try:
        from lightning.fabric import Fabric
    except ImportError:
        try:
            from lightning_fabric import Fabric
        except ImportError:
            raise Unavailable("lightning is not installed") from None
    if ctx.device.is_accelerator and not ctx.device.is_cuda:  # the peers' own device support is what limits this
        raise Unavailable(f"not run on {ctx.device.type} here")
    precision = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}[ctx.precision.name]
    with _quiet():
        try:
            fabric = Fabric(accelerator=ctx.device.type, devices=1, precision=precision)
            opt = _optimizer(ctx, **_fused(ctx))
            model, opt = fabric.setup(ctx.model, opt)
        except Exception as exc:  # noqa: BLE001
            raise Refused(_msg(exc)) from exc
    loss_fn, max_norm = ctx.loss, ctx.max_grad_norm
    # Fabric may run another precision than asked ("16-mixed" is BF16 on the CPU): what ran is read in its step
    probe = AutocastProbe(ctx.model, ctx.device.type)

    def step(b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loss = loss_fn(model, b)
        check_ran(probe, ctx.precision.name, peer="Lightning Fabric", setting=precision)
        fabric.backward(loss)
        try:
            fabric.clip_gradients(model, opt, max_norm=max_norm)
        except Exception as exc:  # noqa: BLE001 - Fabric refuses FP16 clipping with fused optimizers
            raise Refused(_msg(exc)) from exc
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return Built(step=step, cleanup=probe.remove)


def _msg(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' '.join(lines)[:300]}" if lines else type(exc).__name__


_BUILDERS: dict[str, Callable[[Ctx], Built]] = {
    "plain": _plain, "ampkit": _ampkit, "ampkit-graph": _ampkit_graph, "lesson": _lesson,
    "accelerate": _accelerate, "fabric": _fabric,
}


def build(name: str, ctx: Ctx) -> Built:
    """Make runner ``name``'s optimizer, scaler and step function for this configuration."""
    return _BUILDERS[name](ctx)
