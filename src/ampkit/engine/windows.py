"""Accumulation windows and the backward -> step bookkeeping of :class:`ampkit.MixedPrecision`.

Each optimizer counts its own backward -> step cycles, so optimizers stepped together share a window
and a GAN's two optimizers, each with its own backward, each step every ``accumulation_steps`` cycles
(one shared counter let one of them never step). The same records catch a step with no
``amp.backward`` since the optimizer's last step (``loss.backward()`` used instead, or a repeated step).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ampkit.errors import AmpkitError

__all__ = ["Windows", "sync_context"]


class Windows:
    """Per-optimizer ``[cycles in the current window, backward count at its last step]``."""

    def __init__(self, steps_per_window: int) -> None:
        self.size = steps_per_window
        self.backwards = 0  # amp.backward calls so far
        self.start = 0  # window position of optimizers first seen after a restore
        self._by_opt: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def require_backward(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """AmpkitError unless every optimizer has a new amp.backward since its last step."""
        if self.backwards == 0:
            raise AmpkitError("amp.step before any amp.backward: call amp.backward(loss) first (not "
                              "loss.backward(), which skips loss scaling and accumulation)")
        for opt in optimizers:
            record = self._by_opt.get(opt)
            if record is not None and record[1] == self.backwards:
                raise AmpkitError(f"amp.step({type(opt).__name__}) twice on one amp.backward: each step needs "
                                  "its own amp.backward(loss) (not loss.backward()); to step several optimizers "
                                  "on one backward, step each once: amp.step(opt_a, opt_b)")

    def advance(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """Count one cycle for each optimizer; True when their window is complete (then it restarts)."""
        done = set()
        for opt in optimizers:
            record = self._by_opt.setdefault(opt, [self.start, 0])
            record[0] += 1
            record[1] = self.backwards
            done.add(record[0] % self.size == 0)
        if len(done) > 1:
            raise AmpkitError("these optimizers are at different points of their accumulation windows: step "
                              "optimizers that share a backward together, always (amp.step(opt_a, opt_b))")
        if not done.pop():
            return False
        for opt in optimizers:
            self._by_opt[opt][0] = 0
        return True

    @property
    def pending(self) -> int:
        """Cycles accumulated and not yet stepped (the furthest optimizer)."""
        return max([r[0] for r in self._by_opt.values()] or [self.start])

    @property
    def accumulating(self) -> bool:
        """True when the next cycle is a micro-step (for the optimizer furthest behind: in a GAN's
        alternation, the one whose backward comes next)."""
        return (min([r[0] for r in self._by_opt.values()] or [self.start]) + 1) % self.size != 0

    def snapshot(self) -> tuple[int, int, dict]:
        return self.backwards, self.start, {opt: list(r) for opt, r in self._by_opt.items()}

    def restore(self, snap: tuple[int, int, dict]) -> None:
        self.backwards, self.start, records = snap
        self._by_opt.clear()
        self._by_opt.update(records)

    def reset(self, start: int) -> None:
        """Forget every optimizer; new ones start at window position ``start`` (from a checkpoint)."""
        self.start = start
        self._by_opt.clear()


def sync_context(model: nn.Module, *, enabled: bool) -> Any:
    """DDP's ``no_sync()`` / FSDP2 without gradient sync when ``enabled`` (an accumulation micro-step)."""
    if not enabled:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
