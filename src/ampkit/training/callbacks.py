"""Callbacks: user code that the training loop calls before and after each optimizer step.

>>> class Watch(ampkit.Callback):
...     def after_step(self, state):
...         if state.step % 100 == 0 and state.rank == 0:
...             print(state.step, state.optimizer.param_groups[0]["lr"])

``train(TrainConfig(..., callbacks=(Watch(),)))`` from Python, or ``ampkit train --callback
watch.py:make`` from the command line (``make()`` returns the callback; under torchrun every rank
imports the file and builds its own). Callbacks run on every rank, inside the loop: keep them cheap,
and read device values (``.item()``) only when you need them, since that waits for the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError

__all__ = ["Callback", "TrainState", "load_callbacks"]

_HOOKS = ("on_start", "before_step", "after_step", "on_end")


@dataclass
class TrainState:
    """What a callback sees: where the run stands and its live objects.

    ``step``: optimizer steps done so far (in ``before_step`` the step about to run is ``step + 1``).
    ``model`` is the wrapped model under DDP/FSDP2 (FSDP2's parameters and gradients are DTensor shards).
    ``stop``: the signal name once every rank agreed to stop (the loop then saves and returns).

    >>> class LogSteps(ampkit.Callback):
    ...     def after_step(self, state: ampkit.TrainState) -> None:
    ...         if state.step == state.total:
    ...             print(f"step {state.step} of {state.total} on rank {state.rank}")
    >>> _ = ampkit.train(ampkit.TrainConfig(task="digits", precision="fp32", steps=2, callbacks=(LogSteps(),)))
    step 2 of 2 on rank 0
    """

    step: int
    total: int
    rank: int
    world_size: int
    out: Path | None
    model: nn.Module
    optimizer: torch.optim.Optimizer
    amp: Any
    scheduler: Any | None = None
    stop: str | None = None


class Callback:
    """Hooks with no-op defaults: override the ones you need. Called on every rank.

    ``on_start``: after resume, before the first step. ``before_step``: after the step's backward
    pass(es), before the optimizer step (gradients are there, scaled in FP16). ``after_step``: after
    the optimizer step. ``on_end``: after the loop and the final checkpoint, also when a signal stopped it.

    >>> class SayWhenDone(ampkit.Callback):
    ...     def on_end(self, state: ampkit.TrainState) -> None:
    ...         print("ended at step", state.step)
    >>> _ = ampkit.train(ampkit.TrainConfig(task="digits", precision="fp32", steps=3, callbacks=(SayWhenDone(),)))
    ended at step 3
    """

    def on_start(self, state: TrainState) -> None:
        pass

    def before_step(self, state: TrainState) -> None:
        pass

    def after_step(self, state: TrainState) -> None:
        pass

    def on_end(self, state: TrainState) -> None:
        pass


def load_callbacks(items: tuple[Any, ...]) -> list[Any]:
    """Callback objects, and ``FILE.py:factory`` / ``module:factory`` specs built by calling ``factory()``."""
    from ampkit.tasks import import_factory

    out = []
    for item in items:
        if isinstance(item, str):
            factory = import_factory(item, what="callback", returns="an ampkit.Callback")
            try:
                item = factory()
            except Exception as exc:  # noqa: BLE001 - the user's factory: one line, no traceback
                raise UsageError(f"callback {item!r} could not be built: {type(exc).__name__}: {exc}") from exc
        if not any(callable(getattr(item, h, None)) for h in _HOOKS):
            raise UsageError(f"{type(item).__name__} is not a callback: give it one of {', '.join(_HOOKS)} "
                             "(subclass ampkit.Callback)")
        out.append(item)
    return out


def call(callbacks: list[Any], hook: str, state: TrainState) -> None:
    for cb in callbacks:
        fn = getattr(cb, hook, None)
        if fn is not None:
            fn(state)
