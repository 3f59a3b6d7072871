"""Whole-step graph capture: forward, backward, unscale, clip, optimizer step and scaler update
recorded once as one device graph (CUDA graphs; MUSA graphs from QY2 on) and replayed every step.

>>> amp = ampkit.MixedPrecision("fp16", max_grad_norm=1.0, graph=True)          # doctest: +SKIP
>>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)  # doctest: +SKIP
>>> step = amp.graph_step(model, opt, loss_fn, example_batch)  # loss_fn(model, batch) -> loss  # doctest: +SKIP
>>> for batch in loader:                  # fixed shapes: DataLoader(..., drop_last=True)  # doctest: +SKIP
...     loss = step(batch)                # copy into static buffers, replay; see below about `loss`
>>> step.captured, step.fallback_reason   # (True, None), or (False, "why it runs eagerly")  # doctest: +SKIP

Why it is built this way:

* The engine's ``backward`` and ``step`` are separate calls, so a graph of the whole step needs the
  whole step as one callable: :class:`GraphedStep` owns it (``loss_fn(model, batch)`` is the task's
  loss signature, ``ampkit.Task.loss``).
* Capture needs a step with no host synchronisation and fixed addresses. The engine's step is already
  sync-free with a fused optimizer (the skip flag stays on the device), torch's ``GradScaler`` keeps
  its scale and growth tracker on the device, and a fused optimizer built with ``capturable=True``
  keeps its step counts there and takes ``found_inf`` as a device tensor. Gradients are made inside
  the graph's memory pool (set to None before capture, never zeroed after), so every replay writes
  the same tensors that the captured optimizer reads.
* The first ``warmup`` calls are ordinary eager steps (they count as training steps) on a side stream,
  as torch's "whole network capture" recipe asks: they create the optimizer and scaler state and the
  library handles before capture. Capture then happens on the same stream.
* Anything that cannot be captured falls back to eager steps, never silently: the reason is in
  :attr:`GraphedStep.fallback_reason` (and ``amp.graph_fallback_reason``) and is warned once.
  Checked up front: a device without graphs (the CPU), gradient accumulation, an optimizer that is
  not fused and capturable. Checked before capture: host syncs in the model or loss (a forward pass
  under the device's sync debug mode "error"; data-dependent shapes such as ``nonzero`` sync too).
  A capture that still fails is undone and reported.
* The returned loss of a replayed step is the graph's static output tensor: the next call overwrites
  it. ``.clone()`` it (or read it with ``.item()``) before the next step if you keep it.
* The learning rate is baked into the graph when it is a Python float: schedulers must use a tensor
  ``lr`` (``AdamW(..., lr=torch.tensor(1e-3, device=...), fused=True, capturable=True)``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn

from ampkit.errors import DeviceError, UsageError, first_line
from ampkit.engine.step import is_fused, params_of

if TYPE_CHECKING:  # pragma: no cover
    from ampkit.engine import MixedPrecision

__all__ = ["GraphedStep", "capture_blockers"]

LossFn = Callable[[nn.Module, Any], torch.Tensor]


def capture_blockers(amp: "MixedPrecision", optimizer: torch.optim.Optimizer) -> str | None:
    """Why a whole step with this engine and optimizer cannot be captured, or None when it can."""
    dev = amp.device
    if dev.graph_api() is None:
        return f"{dev.type} has no graph capture (CUDA graphs, or MUSA graphs from QY2 on)"
    if amp.accumulation_steps != 1:
        return (f"gradient accumulation (accumulation_steps={amp.accumulation_steps}) is not captured: "
                "use accumulation_steps=1 with graph capture")
    if getattr(amp, "agree", None) is not None:
        return "the cross-rank skip agreement (agree=...) is not captured: use graph capture on one process"
    name = type(optimizer).__name__
    if not is_fused(optimizer):
        return (f"{name} is not a fused optimizer, so its skip decision would need a host read: build it "
                f"with torch.optim.{name}(params, fused=True, capturable=True)")
    if not all(group.get("capturable", False) for group in optimizer.param_groups):
        return (f"{name} was built with capturable=False (its step count would live on the host): "
                f"build it with torch.optim.{name}(params, fused=True, capturable=True)")
    return None


def _first_line(exc: BaseException) -> str:
    while exc.__context__ is not None:  # a failed capture's own error hides the one that broke it
        exc = exc.__context__
    return first_line(exc)


class GraphedStep:
    """One training step (forward, backward, unscale, clip, optimizer step, scaler update) as a
    callable ``step(batch) -> loss``, captured as one device graph where possible.

    Made by :meth:`ampkit.MixedPrecision.graph_step`; see the module docstring for the contract.

    Attributes:
        captured: True once the graph exists and steps replay it.
        fallback_reason: why steps run eagerly (None while capture is possible or done).
        eager_steps: steps run eagerly after capture because a batch had other shapes.
    """

    def __init__(self, amp: "MixedPrecision", model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: LossFn, example_batch: Any, *, warmup: int = 3,
                 parameters: Sequence[torch.Tensor] | None = None, capture: bool | None = None) -> None:
        if warmup < 1:
            raise UsageError(f"warmup must be >= 1 eager step before capture, got {warmup}")
        self.amp = amp
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.warmup = int(warmup)
        self.parameters = list(parameters) if parameters is not None else None
        self.device = amp.device
        self.captured = False
        self.fallback_reason: str | None = None
        self.eager_steps = 0
        self.warmup_done = 0
        self._single = isinstance(example_batch, torch.Tensor)
        self._static: tuple[torch.Tensor, ...] | None = None
        self._graph: Any = None
        self._stream: Any = None
        self._static_loss: torch.Tensor | None = None
        self._graph_grads: list[torch.Tensor | None] = []
        self._warned_shapes = False
        want = getattr(amp, "graph", False) if capture is None else capture
        if not want:
            self._mode = "eager"
            self.fallback_reason = "graph capture is off (MixedPrecision(..., graph=False))"
            return
        reason = capture_blockers(amp, optimizer)
        if reason is None:
            batch = self._as_tuple(example_batch)
            if not all(isinstance(t, torch.Tensor) for t in batch):
                reason = "the batch must be a tensor or a tuple of tensors to be copied into static buffers"
        if reason is not None:
            self._fall_back(reason)
            return
        self._mode = "warmup"
        dev = self.device.torch_device
        self._static = tuple(t.detach().to(dev).clone() for t in batch)
        self._stream = self.device.stream()

    # ------------------------------------------------------------------ public
    @property
    def mode(self) -> str:
        """``"eager"`` (fallback or capture off), ``"warmup"`` (eager steps before capture) or ``"graph"``."""
        return self._mode

    def __call__(self, batch: Any) -> torch.Tensor:
        batch = self._as_tuple(batch)
        if self._mode == "eager":
            return self._eager(self._to_device(batch))
        if self._mode == "graph":
            if not self._fits(batch):
                return self._eager_after_capture(batch)
            self._load(batch)
            self._graph.replay()
            self.amp.advance()
            return self._static_loss
        # warm-up: eager steps on the side stream, then capture on the same stream
        if not self._fits(batch):
            self._fall_back(f"the batch shapes change between steps ({self._shapes(self._static)} then "
                            f"{self._shapes(batch)}): a graph replays fixed shapes; pad the batches or use "
                            "drop_last=True")
            return self._eager(self._to_device(batch))
        self._load(batch)
        if self.warmup_done < self.warmup:
            self.warmup_done += 1
            return self._on_side_stream(lambda: self._eager(self._static))
        if not self._capture():
            return self._eager(self._to_device(batch))
        self._graph.replay()
        return self._static_loss

    # ------------------------------------------------------------------ steps
    def _eager(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        one = batch[0] if self._single else batch
        return self.amp.train_step(self.model, self.loss_fn, [one], self.optimizer, parameters=self.parameters)[0]

    def _eager_after_capture(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if not self._warned_shapes:
            self._warned_shapes = True
            warnings.warn(f"ampkit graph: a batch of shapes {self._shapes(batch)} does not fit the captured "
                          f"{self._shapes(self._static)}: such steps run eagerly (pad batches or use "
                          "drop_last=True to keep every step in the graph)", stacklevel=3)
        self.eager_steps += 1
        params = self._params()
        for p in params:  # the eager step must start from empty gradients, not the graph's last ones
            p.grad = None
        loss = self._eager(self._to_device(batch))
        for p, g in zip(params, self._graph_grads):
            p.grad = g
        return loss

    def _on_side_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        s = self._stream
        s.wait_stream(self.device.current_stream())
        with self.device.use_stream(s):
            out = fn()
        self.device.current_stream().wait_stream(s)
        return out

    # ------------------------------------------------------------------ capture
    def _probe_syncs(self) -> str | None:
        """A forward pass under sync debug mode "error": a host sync there would break the capture."""
        try:
            previous = self.device.get_sync_debug_mode()
            self.device.set_sync_debug_mode("error")
        except (DeviceError, RuntimeError):
            return None  # the backend cannot tell; capture itself will fail if there is one
        try:
            with torch.no_grad(), self.amp.autocast():
                self.loss_fn(self.model, self._static[0] if self._single else self._static)
        except RuntimeError as exc:
            return (f"the model or loss synchronises with the host ({_first_line(exc)}): remove .item(), "
                    ".cpu(), printing of tensors and data-dependent shapes (nonzero, boolean masks) from the step")
        finally:
            self.device.set_sync_debug_mode(previous or 0)
        return None

    def _capture(self) -> bool:
        reason = self._on_side_stream(self._probe_syncs)
        if reason is not None:
            self._fall_back(reason)
            return False
        amp, optimizer = self.amp, self.optimizer
        graph_cls, graph_ctx = self.device.graph_api()
        amp.update()  # the last eager step's scale update stays outside the graph
        optimizer.zero_grad(set_to_none=True)  # gradients are born inside the graph's pool: static addresses
        graph = graph_cls()
        s = self._stream
        s.wait_stream(self.device.current_stream())
        try:
            with amp.capturing(), graph_ctx(graph, stream=s):
                with amp.autocast():
                    loss = self.loss_fn(self.model, self._static[0] if self._single else self._static)
                amp.backward(loss)
                amp.step(optimizer, zero_grad=False, parameters=self.parameters)
                amp.update()  # the scale update is part of every replay
        except Exception as exc:  # noqa: BLE001 - any capture failure means: undo and run eagerly
            optimizer.zero_grad(set_to_none=True)
            self.device.synchronize()
            self._fall_back(f"capture failed: {_first_line(exc)}")
            return False
        self.device.current_stream().wait_stream(s)
        self._graph = graph
        self._static_loss = loss.detach()
        self._graph_grads = [p.grad for p in self._params()]
        self._mode = "graph"
        self.captured = True
        self.amp.graph_fallback_reason = None
        return True

    # ------------------------------------------------------------------ helpers
    def _fall_back(self, reason: str) -> None:
        self._mode = "eager"
        self.fallback_reason = reason
        self.amp.graph_fallback_reason = reason
        self._static = None
        warnings.warn(f"ampkit graph: {reason}; running eager steps", stacklevel=3)

    def _params(self) -> list[torch.Tensor]:
        if self.parameters is not None:
            return self.parameters
        return params_of([self.optimizer])

    def _as_tuple(self, batch: Any) -> tuple[Any, ...]:
        if isinstance(batch, torch.Tensor):
            return (batch,)
        return tuple(batch)

    def _to_device(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        dev = self.device.torch_device
        return tuple(t.to(dev, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch)

    def _fits(self, batch: tuple[Any, ...]) -> bool:
        static = self._static or ()
        return len(batch) == len(static) and all(
            isinstance(t, torch.Tensor) and t.shape == s.shape and t.dtype == s.dtype for t, s in zip(batch, static))

    def _load(self, batch: tuple[torch.Tensor, ...]) -> None:
        for s, t in zip(self._static, batch):
            if t is not s:
                s.copy_(t, non_blocking=True)

    @staticmethod
    def _shapes(batch: Sequence[Any] | None) -> str:
        return ", ".join(str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
                         for t in (batch or ()))

    def __repr__(self) -> str:
        state = "captured" if self.captured else f"eager ({self.fallback_reason})" if self._mode == "eager" else "warm-up"
        return f"GraphedStep({state}, warmup={self.warmup})"
