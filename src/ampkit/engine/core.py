"""The AMP step, done right and without host-device synchronisation.

>>> amp = ampkit.MixedPrecision("auto", max_grad_norm=1.0)              # doctest: +SKIP
>>> for x, y in loader:                                                 # doctest: +SKIP
...     with amp.autocast():
...         loss = loss_fn(model(x), y)
...     amp.backward(loss)      # scaled for fp16; divided by the accumulation steps
...     amp.step(optimizer, scheduler=sched)  # unscale_ -> clip -> skip-if-non-finite -> zero_grad
>>> amp.stats()             # the one host read: steps, skipped, scale, grad norm   # doctest: +SKIP

Why it is built this way:

* The skip decision never leaves the device. ``GradScaler.step`` reads ``found_inf`` on the host
  unless the optimizer is fused; here the flag is handed to torch's fused optimizers, which skip the
  update and roll back their step count on the device. Non-fused optimizers cannot skip on the device:
  for them the engine reads the flag once per step (:meth:`MixedPrecision.uses_host_sync`).
* Several optimizers on one backward are one step: ``amp.step(opt_a, opt_b)`` unscales both, clips
  them to ONE global norm, skips them together. The scaler update is applied once, lazily, before the
  next backward (or by ``update()``, ``stats()``, ``state_dict()``), so ``amp.step(a); amp.step(b)``
  after one backward is torch's documented ``scaler.step(a); scaler.step(b); scaler.update()``.
* Accumulation counts backward -> step cycles per optimizer, so a GAN's two optimizers, each with its
  own backward, each step every ``accumulation_steps`` cycles.
* LR schedulers passed as ``scheduler=`` do not advance on skipped steps; with fused optimizers
  that holds without a host read (:mod:`ampkit.engine.schedule`).
* Counters live on the device and are read in one transfer by :meth:`MixedPrecision.stats`; the
  consecutive-skip limit is checked with one host read every ``skip_check_every`` steps.
* The whole eager step (micro-batches, ``no_sync``, backward, step) exists once, as
  :meth:`MixedPrecision.train_step`: the trainer, the graph path, bench and distributed runs use it.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from ampkit import compat
from ampkit.engine import state as _state, step as _step
from ampkit.engine.config import AmpConfig
from ampkit.engine.counters import DeviceCounters, check_skip_limit
from ampkit.engine.guards import Guards
from ampkit.device import Device, detect_device
from ampkit.errors import AmpkitError, UsageError
from ampkit.device.policy import Precision, apply_tf32, resolve_precision, restore_tf32
from ampkit.engine.schedule import Schedules
from ampkit.engine.step import is_fused
from ampkit.engine.windows import Windows, sync_context

__all__ = ["MixedPrecision", "is_fused"]

LossFn = Callable[[nn.Module, Any], torch.Tensor]


def _device(value: Any) -> Device | None:
    if value is None or isinstance(value, Device):
        return value
    if isinstance(value, (str, torch.device)):
        return detect_device(str(value))
    raise UsageError(f"device takes 'cpu', 'cuda:0', a torch.device or an ampkit Device, got {type(value).__name__}")


class MixedPrecision:
    """Autocast, loss scaling, clipping, non-finite skips, accumulation and schedulers in one object.

    Args:
        precision: a :class:`~ampkit.device.policy.Precision`, a name (``"auto" | "bf16" | "fp16" | "fp32"``, any
            case), a ``torch.dtype``, or None for ``"auto"``.
        config: an :class:`~ampkit.engine.config.AmpConfig` (or a preset name); keyword overrides apply on top:
            ``max_grad_norm``, ``accumulation_steps``, ``init_scale``, ``growth_factor``, ``backoff_factor``,
            ``growth_interval``, ``min_scale``, ``max_consecutive_skips``, ``skip_check_every``,
            ``fp32_modules`` (see AmpConfig for what each means and accepts).
        device: where training runs (a string, ``torch.device`` or Device; default: the precision's).
        set_tf32: apply ``precision.tf32`` to the backend's TF32 switches (process-wide torch state) until
            :meth:`close` (or the end of ``with MixedPrecision(...) as amp:``) puts each back.
        graph: :meth:`graph_step` captures the whole step as one device graph where it can.
        agree: makes the skip flag the same on every rank (``ampkit.distributed``); None for one process.

    >>> amp = ampkit.MixedPrecision("fp32", max_grad_norm=1.0, device=ampkit.Device("cpu"))
    >>> amp.scaler is None, amp.stats()["steps"]
    (True, 0)
    """

    def __init__(self, precision: Precision | str | torch.dtype | None = None, *,
                 config: AmpConfig | str | None = None, device: Device | str | torch.device | None = None,
                 set_tf32: bool = True, graph: bool = False,
                 agree: Callable[[torch.Tensor], torch.Tensor] | None = None, **overrides: Any) -> None:
        if isinstance(config, str):
            config = AmpConfig.preset(config)
        if config is not None and not isinstance(config, AmpConfig):
            raise UsageError(f"config takes an AmpConfig or a preset name, got {type(config).__name__}")
        config = config or AmpConfig()
        self.config = config.replace(**overrides) if overrides else config
        device = _device(device)
        if not isinstance(precision, Precision):
            precision = resolve_precision(precision if precision is not None else "auto", device)
        self.precision = precision
        self.device = device or precision.device
        self.agree = agree
        self._tf32_before = precision.device.tf32_switches() if set_tf32 else {}
        self.tf32_set = apply_tf32(precision) if set_tf32 else {}
        cfg = self.config
        self.scaler: torch.amp.GradScaler | None = None
        if precision.use_scaler:
            self.scaler = self.device.grad_scaler(init_scale=cfg.init_scale, growth_factor=cfg.growth_factor,
                                                  backoff_factor=cfg.backoff_factor,
                                                  growth_interval=cfg.growth_interval)
        self.steps = 0  # optimizer steps taken (python int: no device read needed)
        self._micro = 0  # backward -> step cycles, micro-steps included
        self._update_pending = False
        self._windows = Windows(self.accumulation_steps)
        self._schedules = Schedules()
        self._counters: DeviceCounters | None = None
        self._capturing = False
        self.fp32_regions: Any = None  # set by attach()
        self.master: Any = None  # ampkit.engine.master.MasterWeights, set by attach() under weights="bf16"
        if self.config.weights != "fp32" and precision.name != "bf16":
            raise UsageError(f"weights={self.config.weights!r} needs BF16 precision, got {precision.name}: use "
                             f"MixedPrecision('bf16', weights={self.config.weights!r}) (--precision bf16), or "
                             "weights='fp32'")
        self.graph = bool(graph)
        self.graph_fallback_reason: str | None = None  # set by graph_step when it runs eagerly
        self._guards = Guards(self)  # hand steps, closures, learning rates (ampkit.engine.guards)
        self._closed = False

    # ------------------------------------------------------------------ settings (read-only views)
    @property
    def max_grad_norm(self) -> float | None:
        return self.config.clip_norm

    @property
    def accumulation_steps(self) -> int:
        return int(self.config.accumulation_steps)

    @property
    def min_scale(self) -> float:
        return float(self.config.min_scale)

    @property
    def max_consecutive_skips(self) -> int | None:
        return self.config.max_consecutive_skips

    # ------------------------------------------------------------------ forward / backward
    def autocast(self) -> torch.autocast:
        """The autocast context for this precision (disabled for fp32)."""
        return torch.autocast(device_type=self.device.type, dtype=self.precision.dtype,
                              enabled=self.precision.autocast_enabled)

    @property
    def accumulating(self) -> bool:
        """True when the next :meth:`step` will be an accumulation micro-step (use DDP's ``no_sync``)."""
        return self._windows.accumulating

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for FP16."""
        if not isinstance(loss, torch.Tensor):
            keys = f" with keys {sorted(map(str, loss))[:5]}" if isinstance(loss, dict) else ""
            raise UsageError(f"amp.backward takes the loss tensor, got {type(loss).__name__}{keys}: pass the "
                             "loss itself, e.g. amp.backward(outputs['loss']) or amp.backward(outputs.loss)")
        if not loss.requires_grad:
            raise UsageError("the loss does not require grad (computed under torch.no_grad(), or from detached "
                             "tensors): compute it from the model's output with gradients enabled")
        self._check_open("backward")
        self._guards.before_backward(self, loss)
        self.update()  # the previous step's scaler update, before this loss is scaled
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        self._device_counters(loss.device)
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)
        self._windows.backwards += 1

    # ------------------------------------------------------------------ the step
    def step(self, *optimizers: torch.optim.Optimizer, scheduler: Any = None, zero_grad: bool = True,
             parameters: Iterable[torch.Tensor] | None = None, flush: bool = False) -> bool:
        """unscale_ -> clip (one global norm) -> step, skipped on the device where gradients are not finite
        -> scheduler -> zero_grad, for every optimizer given (they share one backward).

        Returns True when the optimizers were stepped, False on an accumulation micro-step. True does not
        mean the update was applied: a non-finite step is skipped on the device, and saying so on the host
        would cost a sync. ``amp.last_skipped`` is that flag (a device tensor); ``stats()`` reads it.

        ``scheduler``: an LR scheduler or a list; each advances only on applied steps.
        ``parameters``: what to clip (default: every parameter of the optimizers); the skip decision
        always covers every parameter of the optimizers.
        ``flush``: step now, the window incomplete (an epoch's last batches), as the mean of the
        micro-batches it saw (gradients times ``accumulation_steps / cycles``).
        """
        self._check_open("step")
        if not optimizers:
            raise UsageError("amp.step needs the optimizer(s) to step: amp.step(optimizer)")
        for opt in optimizers:
            _step.check_optimizer(opt)
        if len({id(o) for o in optimizers}) != len(optimizers):
            raise UsageError("the same optimizer is given twice to amp.step: pass each once")
        schedulers = Schedules.parse(scheduler)
        parameters = _step.as_parameters(parameters)
        for opt in optimizers:
            self._guards.check_weights(self, opt)
        self._windows.require_backward(optimizers)
        self._micro += 1
        cycles = self._windows.advance(optimizers, flush=flush)
        if not cycles:
            return False
        if self.master is not None:
            with self.master.exact(_step.params_of(optimizers), keep_grads=not zero_grad):
                self._apply_step(list(optimizers), schedulers, parameters, self.accumulation_steps / cycles)
        else:
            self._apply_step(list(optimizers), schedulers, parameters, self.accumulation_steps / cycles)
        if zero_grad:
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
        return True

    def _apply_step(self, optimizers: list[torch.optim.Optimizer], schedulers: list[Any],
                    parameters: list[torch.Tensor] | None, grad_factor: float = 1.0) -> None:
        self._guards.before_step(self, optimizers)
        self._schedules.check(schedulers, self._guards.steps_of)
        params = _step.params_of(optimizers)
        with_grads = [o for o in optimizers if any(p.grad is not None for p in _step.params_of([o]))]
        if not with_grads:
            names = ", ".join(type(o).__name__ for o in optimizers)
            raise AmpkitError(f"no parameter of {names} has a gradient: amp.backward(loss) must run on a loss "
                              "computed from these parameters before amp.step (frozen parameters belong "
                              "outside the optimizer)")
        flags = None
        if self.scaler is not None:
            for opt in with_grads:
                if not compat.unscaled(self.scaler, opt):  # unscale_ by hand (to clip per parameter): once
                    self.scaler.unscale_(opt)
            flags = [f for opt in with_grads for f in compat.found_inf_flags(self.scaler, opt)]
        if grad_factor != 1.0:  # a flushed partial window: the mean of its micro-batches
            torch._foreach_mul_([p.grad for p in params if p.grad is not None], grad_factor)
        norm, found = _step.clip_and_flag(params, parameters, self.max_grad_norm, flags)
        if self.agree is not None:
            # Sharded (FSDP2) gradients, or one rank's own bad gradient: the agreed flag decides the step,
            # and the scaler's update, on every rank alike.
            found = self.agree(found)
            for flag in flags or ():
                flag.copy_(found)
        with self._guards.engine_steps():
            host_skipped = _step.apply(with_grads, found)
        self._update_pending = self.scaler is not None
        self._schedules.after_step(schedulers, found, host_skipped)
        self._count(found, norm)
        self._guards.after_step(self, optimizers)

    def update(self) -> None:
        """Apply the pending FP16 scale update now (``step`` leaves it for the next ``backward`` so that
        several ``step`` calls on one backward share one scale, as ``scaler.update()`` after them does)."""
        if self._update_pending and self.scaler is not None:
            self._update_pending = False
            self.scaler.update()
            if self.min_scale > 0:
                compat.clamp_scale_(self.scaler, self.min_scale)  # the floor torch lacks

    def train_step(self, model: nn.Module, loss_fn: LossFn, batches: Sequence[Any],
                   *optimizers: torch.optim.Optimizer, scheduler: Any = None,
                   parameters: Iterable[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """One whole optimizer step: ``accumulation_steps`` micro-batches, each forward under autocast and
        backward (under DDP ``no_sync`` / FSDP2 without gradient sync except the last), then :meth:`step`
        and the scaler update. Returns the micro-batch losses (detached, on the device; a list, so that no
        kernel is added to stack them).

        ``loss_fn(model, batch)`` returns the loss; ``batches`` is a sequence of exactly
        ``accumulation_steps`` micro-batches (``[batch]`` without accumulation).
        """
        if isinstance(batches, (torch.Tensor, dict)) or len(batches) != self.accumulation_steps:
            got = "a single batch" if isinstance(batches, (torch.Tensor, dict)) else f"{len(batches)}"
            raise UsageError(f"train_step takes a list of {self.accumulation_steps} micro-batch(es) "
                             f"(accumulation_steps), got {got}: pass [batch] without accumulation")
        params = list(parameters) if parameters is not None else None
        losses = []
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            with sync_context(model, enabled=not last), self.autocast():
                loss = loss_fn(model, batch)
            with sync_context(model, enabled=not last):
                self.backward(loss)
            losses.append(loss.detach())
            self.step(*optimizers, scheduler=scheduler, parameters=params)
        self.update()
        return losses

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Around the recording of a step into a device graph (:mod:`ampkit.engine.graph`): the periodic host
        check is deferred (a host read cannot be captured), and if the block raises, the host-side
        counters and the scaler's per-optimizer records go back to what they were."""
        saved = (self.steps, self._micro, self._update_pending, self._windows.snapshot())
        self._capturing = True
        try:
            yield
        except BaseException:
            self.steps, self._micro, self._update_pending, windows = saved
            self._windows.restore(windows)
            if self.scaler is not None:
                compat.forget_unscale(self.scaler)  # an unscale_ recorded during the failed capture
            raise
        finally:
            self._capturing = False

    def advance(self) -> None:
        """Count one step that ran outside :meth:`step` (a replayed graph of it, whose device counters
        were captured with it); runs the periodic skip check."""
        self._micro += 1
        self.steps += 1
        self._periodic_check()

    # ------------------------------------------------------------------ step helpers
    def sync_schedulers(self) -> None:
        """Bring every scheduler driven on the device (fused optimizers) to its true position: its
        ``last_epoch``, ``get_last_lr()`` and ``state_dict()`` are then right. One host read."""
        self._schedules.sync()

    # ------------------------------------------------------------------ counters
    def _device_counters(self, device: torch.device) -> DeviceCounters:
        if self._counters is None:
            self._counters = DeviceCounters(device, self.scaler)
        return self._counters

    def _count(self, found: torch.Tensor, norm: torch.Tensor) -> None:
        self.steps += 1
        self._device_counters(found.device).count(found, norm)
        self._periodic_check()

    def _periodic_check(self) -> None:
        every = self.config.check_every
        if every is not None and self.steps % every == 0 and self._counters is not None and not self._capturing:
            self._halt_if_limit(self._counters.read_max_consecutive())  # one host read every `every` steps

    def _halt_if_limit(self, max_consec: float, scale: float | None = None, streak: float | None = None) -> None:
        check_skip_limit(max_consec, self.max_consecutive_skips, step=self.steps, scale=scale,
                         scaler=self.precision.use_scaler, streak=streak)

    @property
    def last_skipped(self) -> torch.Tensor:
        """The last step's skip flag as a device tensor (1.0 skipped, 0.0 applied), read without a sync.
        It is a view the next step overwrites: ``.clone()`` it to keep it."""
        return self._device_counters(self.device.torch_device).last_skipped

    # ------------------------------------------------------------------ graphs
    def graph_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, example_batch: Any,
                   *, warmup: int = 3, parameters: Iterable[torch.Tensor] | None = None) -> Any:
        """The whole step as one callable ``step(batch) -> loss``, captured as a device graph when the
        engine was made with ``graph=True`` (see :mod:`ampkit.engine.graph`); where capture is impossible every
        call is an eager step and ``graph_fallback_reason`` says why.
        """
        from ampkit.engine.graph import GraphedStep  # graph imports the engine's public API only

        return GraphedStep(self, model, optimizer, loss_fn, example_batch, warmup=warmup,
                           parameters=list(parameters) if parameters is not None else None)

    def uses_host_sync(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether :meth:`step` reads the device each step with this optimizer (non-fused ones do)."""
        return not is_fused(optimizer)

    # ------------------------------------------------------------------ distributed
    def no_sync(self, model: nn.Module) -> Any:
        """DDP's ``no_sync`` (FSDP2's ``set_requires_gradient_sync(False)``) on accumulation micro-steps;
        a no-op otherwise."""
        return sync_context(model, enabled=self.accumulating)

    # ------------------------------------------------------------------ FP32 regions
    def attach(self, model: nn.Module) -> Any:
        """Install the ``fp32_modules`` regions on ``model`` (forward hooks: autocast off and FP32 inputs in
        the matched modules; the model's ``forward`` is not touched). Returns the regions (``.names``:
        the modules matched), or None when ``fp32_modules`` is empty. :meth:`detach` removes them.

        Under ``weights="bf16"`` (or ``"bf16-pure"``) it also stores the model's FP32 parameters as BF16, in
        place (:mod:`ampkit.engine.master`): call it before the first step; an optimizer made before or after
        it works alike."""
        from ampkit.engine.regions import apply_fp32_regions

        if self.config.weights != "fp32" and self.master is None:
            from ampkit.engine.master import MasterWeights

            self.master = MasterWeights.convert(model, pure=self.config.weights == "bf16-pure")
        self.detach()
        if self.config.fp32_specs:
            self.fp32_regions = apply_fp32_regions(model, self.config.fp32_specs, device_type=self.device.type)
        return self.fp32_regions

    def detach(self) -> None:
        """Remove the hooks :meth:`attach` installed (the model then behaves exactly as before)."""
        if self.fp32_regions is not None:
            self.fp32_regions.remove()
            self.fp32_regions = None

    def exact_weights(self) -> Any:
        """A context in which the ``weights="bf16"`` parameters are their exact FP32 values (a no-op otherwise).
        Load an optimizer's state dict inside it (torch casts optimizer states to the parameters' dtype):
        ``with amp.exact_weights(): optimizer.load_state_dict(sd)``; :func:`ampkit.restore` does this for you."""
        if self.master is None:
            return contextlib.nullcontext()
        return self.master.exact()

    # ------------------------------------------------------------------ stats & state
    def stats(self) -> dict[str, Any]:
        """Counters in one host read: ``steps, skipped, consecutive_skips, scale, grad_norm, last_skipped``.
        Applies a pending scale update and brings device-driven schedulers to their position first.

        Raises :class:`~ampkit.errors.TrainingHalted` when ``max_consecutive_skips`` steps in a row were
        skipped since the last read.
        """
        self.update()
        self.sync_schedulers()
        scale_t = compat.scaler_tensors(self.scaler)[0] if self.scaler is not None else None
        if self._counters is None:
            scale = self.scaler.get_scale() if self.scaler is not None else 1.0
            return {"steps": self.steps, "skipped": 0, "consecutive_skips": 0, "scale": float(scale),
                    "grad_norm": None, "last_skipped": False}
        values = self._counters.read(scale_t)  # the one device -> host transfer
        skipped, consec, max_consec, norm, last = values[:5]
        if len(values) > 5:
            scale = values[5]
        else:  # no scaler, or one restored from a checkpoint and not yet used (no device tensor yet)
            scale = float(self.scaler.get_scale()) if self.scaler is not None else 1.0
        self._halt_if_limit(max_consec, scale, consec)
        return {"steps": self.steps, "skipped": int(skipped), "consecutive_skips": int(consec), "scale": scale,
                "grad_norm": norm, "last_skipped": bool(last)}

    @property
    def accumulation_pending(self) -> int:
        """Backward -> step cycles accumulated and not yet stepped (0 on a window boundary: the moment a
        checkpoint can be exact, since partial gradients are not saved)."""
        return self._windows.pending

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: precision, scaler state, counters (loads with weights_only).
        Applies a pending scale update and syncs device-driven schedulers first (save theirs after this)."""
        return _state.engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore from :meth:`state_dict`. Returns notes (e.g. scaler state dropped on a precision change)."""
        notes = _state.load_engine_state(self, state)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return notes

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise UsageError(f"amp.{what} after amp.close(): a closed engine no longer trains; make a new "
                             "MixedPrecision (load this one's state_dict() into it to continue)")

    def close(self) -> None:
        """End training with this engine (idempotent): put the TF32 switches it set back and remove its step
        hook. Afterwards ``backward`` and ``step`` are refused; ``stats()`` and ``state_dict()`` still work.
        ``ampkit train`` calls it at the end of a run; ``with MixedPrecision(...) as amp:`` on leaving the block."""
        self._closed = True
        self._guards.remove()
        if self._tf32_before:
            restore_tf32(self.precision.device, self._tf32_before)
            self._tf32_before = {}

    def __enter__(self) -> "MixedPrecision":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MixedPrecision({self.precision.name}, device={self.device}, scaler={self.scaler is not None}, "
                f"max_grad_norm={self.max_grad_norm}, accumulation_steps={self.accumulation_steps})")
