"""The AMP step, done right and without host-device synchronisation.

>>> prec = ampkit.resolve_precision("auto")                       # doctest: +SKIP
>>> amp = ampkit.MixedPrecision(prec, max_grad_norm=1.0)          # doctest: +SKIP
>>> for x, y in loader:                                           # doctest: +SKIP
...     with amp.autocast():
...         loss = loss_fn(model(x), y)
...     amp.backward(loss)      # scaled for fp16; divided by the accumulation steps
...     amp.step(optimizer)     # unscale_ -> clip -> skip-if-non-finite step -> scaler update -> zero_grad
>>> amp.stats()             # the one host read: steps, skipped, scale, grad norm   # doctest: +SKIP

Why it is built this way:

* The skip decision never leaves the device. ``GradScaler.step`` reads ``found_inf`` on the host
  (``.item()``) unless the optimizer is fused; the lesson's loop adds ``if not torch.isfinite(loss)``
  every step. Here the found-inf flag is a device tensor handed to torch's fused optimizers
  (``optimizer.found_inf``), which skip the update and roll back their step count on the device.
  Non-fused optimizers cannot skip on the device: for them the engine reads the flag once per
  step (one sync) and says so in :meth:`MixedPrecision.uses_host_sync`.
* Clipping works with fused optimizers: gradients are unscaled first (``unscale_``), clipped, and
  the optimizer is then told they are already unscaled (``grad_scale=None``).
* Counters (steps skipped, consecutive skips, last gradient norm) live on the device and are read in
  one transfer by :meth:`MixedPrecision.stats`.
* What torch lacks and DeepSpeed has: a scale floor (``min_scale``) and a consecutive-skip limit
  (``max_consecutive_skips``) after which :meth:`stats` raises :class:`~ampkit.errors.TrainingHalted`.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from ampkit.device import Device
from ampkit.errors import AmpkitError, TrainingHalted, UsageError
from ampkit.policy import Precision, apply_tf32, resolve_precision

__all__ = ["MixedPrecision", "is_fused"]


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's gradient norm comes back as one); other tensors unchanged."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer can take the found-inf flag on the device (torch's fused kernels)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and bool(
        optimizer.defaults.get("fused", False)
    )


class MixedPrecision:
    """Autocast, loss scaling, clipping, non-finite skips and gradient accumulation in one object.

    Args:
        precision: a :class:`~ampkit.policy.Precision`, a name (``"auto" | "bf16" | "fp16" | "fp32"``)
            or None for ``"auto"``.
        max_grad_norm: clip the global gradient norm to this (after unscaling); None: no clipping
            (the norm is still measured, for skips and stats).
        accumulation_steps: micro-batches per optimizer step; ``backward`` divides the loss by it.
        init_scale, growth_factor, backoff_factor, growth_interval: the FP16 loss scaler's settings.
        min_scale: the FP16 scale never goes below this.
        max_consecutive_skips: after this many skipped steps in a row, :meth:`stats` raises
            :class:`~ampkit.errors.TrainingHalted`. None: never.
        device: where training runs (default: the precision's device).
        set_tf32: apply ``precision.tf32`` to the backend's TF32 switches (global torch state).
        graph: :meth:`graph_step` captures the whole step as one device graph (CUDA graphs; MUSA
            graphs from QY2 on); where it cannot, it runs eager steps and says why
            (``graph_fallback_reason``). Needs a fused optimizer built with ``capturable=True``.
        agree: makes the skip flag the same on every rank (``ampkit.distributed.agree_found_inf``: an
            all_reduce MAX, queued on the device); None for one process. With it, the scaler's own
            found-inf flags are overwritten by the agreed one, so every rank also updates the scale alike.

    >>> amp = ampkit.MixedPrecision("fp32", max_grad_norm=1.0, device=ampkit.Device("cpu"))
    >>> amp.scaler is None, amp.stats()["steps"]
    (True, 0)
    """

    def __init__(
        self,
        precision: Precision | str | None = None,
        *,
        max_grad_norm: float | None = None,
        accumulation_steps: int = 1,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        max_consecutive_skips: int | None = 50,
        device: Device | None = None,
        set_tf32: bool = True,
        graph: bool = False,
        agree: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if precision is None or isinstance(precision, str):
            precision = resolve_precision(precision or "auto", device)
        if accumulation_steps < 1:
            raise UsageError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise UsageError(f"max_grad_norm must be positive, got {max_grad_norm}")
        if max_consecutive_skips is not None and max_consecutive_skips < 1:
            raise UsageError(f"max_consecutive_skips must be >= 1 or None, got {max_consecutive_skips}")
        self.precision = precision
        self.device = device or precision.device
        self.agree = agree
        self.max_grad_norm = max_grad_norm
        self.accumulation_steps = int(accumulation_steps)
        self.min_scale = float(min_scale)
        self.max_consecutive_skips = max_consecutive_skips
        self.tf32_set = apply_tf32(precision) if set_tf32 else {}
        self.scaler: torch.amp.GradScaler | None = None
        if precision.use_scaler:
            self.scaler = self.device.grad_scaler(
                init_scale=init_scale,
                growth_factor=growth_factor,
                backoff_factor=backoff_factor,
                growth_interval=growth_interval,
            )
        self._scaler_kwargs = dict(init_scale=init_scale, growth_factor=growth_factor,
                                   backoff_factor=backoff_factor, growth_interval=growth_interval)
        self.steps = 0  # optimizer steps attempted (python int: no device read needed)
        self._micro = 0
        # One small device tensor holds every counter, so the engine adds a single allocator block:
        # [skipped, consecutive skips, max consecutive since the last read, last grad norm, last skipped].
        # float32 counts exactly up to 2**24 skipped steps.
        self._state: torch.Tensor | None = None
        self._checked: set[int] = set()
        self._params_cache: dict[int, list[nn.Parameter]] = {}
        self.graph = bool(graph)
        self.graph_fallback_reason: str | None = None  # set by graph_step when it runs eagerly

    # ------------------------------------------------------------------ forward / backward
    def autocast(self) -> torch.autocast:
        """The autocast context for this precision (disabled for fp32)."""
        return torch.autocast(device_type=self.device.type, dtype=self.precision.dtype,
                              enabled=self.precision.autocast_enabled)

    @property
    def accumulating(self) -> bool:
        """True when the next :meth:`step` is a micro-step that will not update (use DDP's ``no_sync``)."""
        return (self._micro + 1) % self.accumulation_steps != 0

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for FP16."""
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        if self._state is None:
            self._new_state(loss.device)
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    # ------------------------------------------------------------------ the step
    def step(self, optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor] | None = None,
             *, zero_grad: bool = True) -> bool:
        """unscale_ -> clip -> step (skipped on the device if gradients are not finite) -> scaler
        update -> zero_grad. On an accumulation micro-step it does nothing and returns False.

        ``parameters``: what to clip (default: every parameter of ``optimizer``).
        """
        self._micro += 1
        if self._micro % self.accumulation_steps:
            return False
        self._check_optimizer(optimizer)
        params = list(parameters) if parameters is not None else self._optimizer_params(optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        norm = _full(self._clip_or_measure(params, grads))
        found = self._nonfinite_flag(norm, optimizer)
        if self.agree is not None:
            # Sharded (FSDP2) gradients, or one rank's own bad gradient: each rank's flag says only what it
            # saw. The agreed flag decides the step, and the scaler's update, on every rank alike.
            found = self.agree(found)
            if self.scaler is not None:
                for flag in self.scaler._found_inf_per_device(optimizer).values():
                    flag.copy_(found)
        self._optimizer_step(optimizer, found)
        if self.scaler is not None:
            self.scaler.update()
            if self.min_scale > 0:
                self.scaler._scale.clamp_(min=self.min_scale)  # the floor torch lacks
        self._count(found, norm)
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        return True

    def _clip_or_measure(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
        if not grads:
            dev = params[0].device if params else self.device.torch_device
            return torch.zeros((), device=dev)
        if self.max_grad_norm is not None:
            return torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if hasattr(grads[0], "full_tensor"):  # DTensor (FSDP2) shards: torch reduces the norm over ranks
            return torch.nn.utils.get_total_norm(grads)
        norms = torch._foreach_norm(grads)
        return torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]))

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, found: torch.Tensor) -> None:
        if is_fused(optimizer):
            # Gradients are already unscaled: the fused kernel only needs the skip flag, which it
            # reads on the device (and it rolls back its step count when set).
            optimizer.grad_scale = None  # type: ignore[attr-defined]
            optimizer.found_inf = found  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale  # type: ignore[attr-defined]
                del optimizer.found_inf  # type: ignore[attr-defined]
        elif not bool(found):  # one host read: non-fused optimizers cannot skip on the device
            optimizer.step()

    def _nonfinite_flag(self, norm: torch.Tensor, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """1.0 when this step's gradients are not finite, else 0.0: a float32 device tensor, as the fused
        optimizers take it. Written for few dispatches: this runs every step, and on small models the
        per-op launch cost is what an engine adds over a hand-written loop."""
        if self.scaler is not None:
            # unscale_ already checked every gradient for inf/NaN: its flag is the answer.
            flags = list(self.scaler._found_inf_per_device(optimizer).values())
            found = flags[0]
            for flag in flags[1:]:
                found = torch.maximum(found, flag.to(found.device, non_blocking=True))
            return found
        # x - x is 0 for a finite x and NaN for inf/NaN; ne_ turns that into 0.0 / 1.0 in place.
        n = norm.detach().float()
        return (n - n).ne_(0)

    def _count(self, found: torch.Tensor, norm: torch.Tensor) -> None:
        self.steps += 1
        if self._state is None:
            self._new_state(found.device)
        skipped, consec, max_consec, last_norm, last, one = self._views
        torch._foreach_add_([skipped, consec], [found, one])
        consec.mul_(found)
        torch.maximum(max_consec, consec, out=max_consec)
        torch._foreach_copy_([last_norm, last], [norm.detach().float(), found])

    def _new_state(self, device: torch.device) -> None:
        # One allocation for everything the engine keeps on the device:
        #   0 skipped, 1 consecutive skips, 2 max consecutive since the last read, 3 last grad norm,
        #   4 last skipped, 5 the constant 1.0 (so the update needs no other tensor),
        #   6 the FP16 loss scale, 7 the scaler's growth tracker (int32 bits).
        self._state = torch.zeros(8, dtype=torch.float32, device=device)
        self._state[5] = 1.0
        self._views = self._state[:6].unbind()  # made once: no per-step indexing
        scaler = self.scaler
        if scaler is not None and scaler._scale is None:
            # GradScaler makes its scale and growth tracker lazily, as two more one-element tensors (two
            # more allocator blocks) in its first scale(). Handing it views of this block instead keeps
            # FP16 training from allocating anything a hand-written loop would not.
            self._state[6] = scaler._init_scale
            tracker = self._state[7:8].view(torch.int32)
            tracker.fill_(scaler._init_growth_tracker)
            scaler._scale = self._state[6]
            scaler._growth_tracker = tracker[0]

    def graph_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Any, example_batch: Any,
                   *, warmup: int = 3, parameters: Iterable[torch.Tensor] | None = None) -> Any:
        """The whole step as one callable ``step(batch) -> loss``, captured as a device graph when the
        engine was made with ``graph=True`` (see :mod:`ampkit.graph`).

        ``loss_fn(model, batch)`` returns the loss (it runs under :meth:`autocast`). The first ``warmup``
        calls are eager steps on a side stream; the next one captures and replays. Where capture is
        impossible (no graphs on the device, a non-capturable optimizer, host syncs in the model) every
        call is an eager step and ``graph_fallback_reason`` says why.

        >>> opt = torch.optim.AdamW(model.parameters(), fused=True, capturable=True)  # doctest: +SKIP
        >>> step = amp.graph_step(model, opt, lambda m, b: F.mse_loss(m(b[0]), b[1]), (x, y))  # doctest: +SKIP
        >>> loss = step((x, y))                                                     # doctest: +SKIP
        """
        from ampkit.graph import GraphedStep

        return GraphedStep(self, model, optimizer, loss_fn, example_batch, warmup=warmup,
                           parameters=list(parameters) if parameters is not None else None)

    def uses_host_sync(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether :meth:`step` reads the device each step with this optimizer (non-fused ones do)."""
        return not is_fused(optimizer)

    # ------------------------------------------------------------------ checks
    def _optimizer_params(self, optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
        key = id(optimizer)
        if key not in self._params_cache:
            self._params_cache[key] = [p for g in optimizer.param_groups for p in g["params"]]
        return self._params_cache[key]

    def _check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._checked:
            return
        if self.scaler is not None:
            half = [p for p in self._optimizer_params(optimizer) if p.dtype == torch.float16]
            if half:
                raise AmpkitError(
                    f"{len(half)} parameter(s) are FP16 while FP16 loss scaling is on: the optimizer would "
                    "update FP16 weights (torch says 'Attempting to unscale FP16 gradients'). Keep the "
                    "model in FP32 (remove model.half() / .to(torch.float16)) and let autocast cast: "
                    "the weights stay FP32 master copies"
                )
        self._checked.add(id(optimizer))

    # ------------------------------------------------------------------ stats & state
    def stats(self) -> dict[str, Any]:
        """Counters in one host read: ``steps, skipped, consecutive_skips, scale, grad_norm, last_skipped``.

        Raises :class:`~ampkit.errors.TrainingHalted` when more than ``max_consecutive_skips``
        steps in a row were skipped since the last read.
        """
        if self._state is None:
            scale = self.scaler.get_scale() if self.scaler is not None else 1.0
            return {"steps": self.steps, "skipped": 0, "consecutive_skips": 0, "scale": float(scale),
                    "grad_norm": None, "last_skipped": False}
        parts = [self._state[:5].to(torch.float64)]
        if self.scaler is not None and self.scaler._scale is not None:
            parts.append(self.scaler._scale.to(self._state.device, torch.float64).reshape(1))
        values = torch.cat(parts).tolist()  # the one device -> host transfer
        skipped, consec, max_consec, norm, last = values[:5]
        if len(values) > 5:
            scale = values[5]
        else:  # no scaler, or one restored from a checkpoint and not yet used (no device tensor yet)
            scale = float(self.scaler.get_scale()) if self.scaler is not None else 1.0
        self._state[2].copy_(self._state[1])
        out = {"steps": self.steps, "skipped": int(skipped), "consecutive_skips": int(consec), "scale": scale,
               "grad_norm": norm, "last_skipped": bool(last)}
        if self.max_consecutive_skips is not None and max_consec >= self.max_consecutive_skips:
            raise TrainingHalted(
                f"{int(max_consec)} optimizer steps in a row had non-finite gradients (scale {scale:g}): "
                f"training stopped at step {self.steps}. Find the cause with `ampkit diagnose SCRIPT` "
                + ("(and try --precision bf16 where the card has it, or a lower learning rate)"
                   if self.precision.use_scaler else "(and try a lower learning rate or --precision fp32)")
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: precision, scaler state, counters (loads with weights_only)."""
        return {
            "precision": self.precision.name,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "steps": self.steps,
            "micro": self._micro,
            # [skipped, consecutive, max_consecutive] as int64, the format since ampkit 0.1
            "counters": None if self._state is None else self._state[:3].detach().to("cpu", torch.int64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore from :meth:`state_dict`. Returns notes (e.g. scaler state dropped on a precision change)."""
        notes: list[str] = []
        saved = state.get("precision")
        self.steps = int(state.get("steps", 0))
        self._micro = int(state.get("micro", self.steps * self.accumulation_steps))
        counters = state.get("counters")
        if counters is not None:
            dev = self._state_device()
            self._new_state(dev)
            self._state[:3].copy_(counters.to(dev, torch.float32))
        scaler_state = state.get("scaler")
        if self.scaler is not None:
            if scaler_state:
                self.scaler.load_state_dict(scaler_state)
            else:
                notes.append(f"checkpoint was {saved} without a loss scaler: starting a fresh FP16 scaler "
                             f"(scale {self._scaler_kwargs['init_scale']:g})")
        elif scaler_state:
            notes.append(f"checkpoint was {saved} with a loss scaler; {self.precision.name} needs none: "
                         "scaler state dropped")
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return notes

    def _state_device(self) -> torch.device:
        return self.device.torch_device

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """DDP's ``no_sync`` (FSDP2's ``set_requires_gradient_sync(False)``) on accumulation micro-steps;
        a no-op otherwise."""
        if self.accumulating and hasattr(model, "no_sync"):
            with model.no_sync():
                yield
        elif self.accumulating and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        else:
            yield

    def __repr__(self) -> str:
        return (f"MixedPrecision({self.precision.name}, device={self.device}, scaler={self.scaler is not None}, "
                f"max_grad_norm={self.max_grad_norm}, accumulation_steps={self.accumulation_steps})")
