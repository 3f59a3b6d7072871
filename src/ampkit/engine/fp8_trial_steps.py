"""The FP8 trial's timing: whole training steps of a copy of the user's model per candidate layer set.

:class:`StepTrial` is the ``measure`` of :func:`ampkit.engine.fp8_trial.run_trial`: for each candidate it
deep-copies the model (the user's model is left as it is), converts the candidate's layers with torchao, compiles
model + loss when the run is compiled, builds the run's optimizer and returns a timer. The timer's first call runs
the warm-up steps (the compile happens there), every call then times ``steps`` whole engine steps (forward,
backward, clipping, optimizer: :meth:`ampkit.engine.MixedPrecision.train_step`, the one training step) between
two device events and returns milliseconds per step. :meth:`StepTrial.release` frees the copies.

All candidates are alive at once, so that their rounds interleave: the copies cost the model's weights, gradients
and optimizer state once each (about 16 bytes a parameter with AdamW).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn

from ampkit.compat import recompile_limit
from ampkit.device import Device
from ampkit.device.policy import Precision
from ampkit.engine.fp8 import FP8Report, convert
from ampkit.engine.fp8_trial import Candidate

__all__ = ["StepTrial", "LossModule"]


class LossModule(nn.Module):
    """model + loss as one module, so ``torch.compile`` fuses the loss into the compiled region."""

    def __init__(self, model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._loss = loss

    def forward(self, batch: Any) -> torch.Tensor:
        return self._loss(self.model, batch)


class StepTrial:
    """Times training steps of candidate layer sets of ``model`` (see the module's docstring).

    ``loss(model, batch)``: the run's loss; ``batches``: a few batches already on the device, cycled;
    ``make_optimizer(model)``: the run's optimizer for a copy; ``compile_kwargs``: ``torch.compile``'s arguments
    (None: eager steps)."""

    def __init__(self, *, model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor], batches: list[Any],
                 make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], precision: Precision, device: Device,
                 recipe: str, compile_kwargs: dict[str, Any] | None = None, steps: int = 5, warmup: int = 3,
                 max_grad_norm: float | None = 1.0) -> None:
        if not batches:
            raise ValueError("the FP8 trial needs at least one batch")
        self.model, self.loss, self.batches = model, loss, list(batches)
        self.make_optimizer, self.precision, self.device = make_optimizer, precision, device
        self.recipe, self.compile_kwargs = recipe, compile_kwargs
        self.steps, self.warmup, self.max_grad_norm = max(1, steps), max(0, warmup), max_grad_norm
        self._built: list[Any] = []
        self._i = 0

    def __call__(self, candidate: Candidate) -> Callable[[], float]:
        from ampkit.engine import MixedPrecision

        model = copy.deepcopy(self.model)
        if candidate.converted:
            convert(model, chosen=FP8Report(self.recipe, candidate.converted))
        if self.compile_kwargs is not None:
            fwd_module = torch.compile(LossModule(model, self.loss), **self.compile_kwargs)

            def loss_fn(_m: nn.Module, b: Any, f: Any = fwd_module) -> torch.Tensor:
                return f(b)
        else:
            loss_fn = self.loss
        opt = self.make_optimizer(model)
        amp = MixedPrecision(self.precision, max_grad_norm=self.max_grad_norm, device=self.device)
        self._built.append((model, opt, amp))
        state = {"warm": False}

        def one() -> None:
            b = self.batches[self._i % len(self.batches)]
            self._i += 1
            amp.train_step(model, loss_fn, [b], opt)

        def timer() -> float:
            with recompile_limit(64):  # one compile per candidate: never a silent eager fallback
                if not state["warm"]:
                    for _ in range(self.warmup):
                        one()
                    self.device.synchronize()
                    state["warm"] = True
                t = self.device.timer().start()
                for _ in range(self.steps):
                    one()
                return t.stop().elapsed() * 1e3 / self.steps

        return timer

    def release(self) -> None:
        """Drop every copy (weights, gradients, optimizer state) and give their memory back to the device."""
        self._built.clear()
        self.device.empty_cache()
