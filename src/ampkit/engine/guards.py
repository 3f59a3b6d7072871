"""The checks that stop a loop which would otherwise train silently wrong, all on the host and free of
device reads (a learning rate is a Python float; parameters and optimizers are Python objects).

* **Hand steps.** While an engine is open, one global optimizer step pre-hook
  (``torch.optim.optimizer.register_optimizer_step_pre_hook``) sees every ``optimizer.step()`` that the
  engine did not make itself. Under FP16 loss scaling, a hand step of an optimizer whose gradients came
  from ``amp.backward`` would apply gradients multiplied by the loss scale: it is refused
  (:class:`~ampkit.errors.AmpkitError`, raised from that ``step()`` before anything is updated). It is
  allowed when ``amp.scaler.unscale_(optimizer)`` ran first (torch's own recipe, whose skip is then the
  caller's) and for optimizers whose parameters ``amp.backward`` never reached (another model trained on
  its own ``loss.backward()`` in the same loop). The hook is removed by ``close()`` or when the engine
  is garbage; it touches nothing of the user's objects (a closure it sees is wrapped for that call only).
* **Closures.** ``amp.backward`` inside an optimizer's closure (LBFGS) under FP16 is refused: LBFGS
  calls the closure several times per step and reads the gradients and the loss itself, so the loss
  scale cannot be taken back out.
* **Which parameters ``amp.backward`` reaches** is read from the autograd graph during the first
  :data:`TRACE_STEPS` steps only (a walk of the graph's nodes on the host; afterwards nothing). At that
  step, parameters that got gradients but belong to no optimizer that was stepped (through ``amp.step``
  or by hand) get one warning: their gradients keep accumulating. A warning, not an error: parameters
  left out of every optimizer on purpose, with ``requires_grad`` still on, are legitimate.
* **Learning rates.** A non-finite float ``lr`` in any param group is refused at the step that would
  use it, naming the optimizer and group (``check_lrs``); a scheduler that produces one is named by
  :mod:`ampkit.engine.schedule`. A tensor ``lr`` (``capturable``) is not read on the host.
* ``fp32_modules`` given without ``amp.attach(model)``: a UsageError at the first step, before the optimizer
  steps (the declared modules would otherwise train in low precision).
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch
import torch.optim.optimizer as _optim

from ampkit import compat
from ampkit.engine import step as _step
from ampkit.errors import AmpkitError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ampkit.engine.core import MixedPrecision

__all__ = ["Guards", "check_lrs", "TRACE_STEPS"]

#: Steps during which the engine records which parameters ``amp.backward`` reaches.
TRACE_STEPS = 2

_stepping = [0]  # > 0 while any engine steps optimizers itself (one engine's step is no hand step for another)


def check_lrs(optimizers: Sequence[torch.optim.Optimizer], by: Any = None) -> None:
    """AmpkitError when a param group's float learning rate is NaN or infinite (``by``: who set it)."""
    for opt in optimizers:
        for i, group in enumerate(opt.param_groups):
            lr = group.get("lr")
            if isinstance(lr, (float, int)) and not math.isfinite(lr):
                who = f"{type(by).__name__} set " if by is not None else ""
                raise AmpkitError(
                    f"{who}the learning rate of {type(opt).__name__} param group {i} to {lr}: the step would "
                    f"write {lr} weights. Give a finite lr (check the scheduler's function and arguments)")


def _leaves(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors (parameters) that a backward of ``loss`` accumulates gradients into."""
    # `seen` keeps each node's Python object alive: a node's wrapper is freed once nothing holds it, and a
    # later wrapper may then reuse its id (seen on torch 2.5: every leaf skipped as "already visited").
    out, seen, stack = [], {}, [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        var = getattr(fn, "variable", None)  # AccumulateGrad nodes hold their leaf
        if isinstance(var, torch.Tensor):
            out.append(var)
        stack.extend(f for f, _ in fn.next_functions)
    return out


class Guards:
    """One engine's hand-step hook, closure check and first-steps bookkeeping (see the module docstring)."""

    def __init__(self, amp: "MixedPrecision") -> None:
        self._amp = weakref.ref(amp)
        self._closure_depth = 0
        self._reached: dict[int, weakref.ref] = {}  # id -> parameter amp.backward reached (first steps)
        self.stepped: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()  # by amp.step or by hand
        self.steps_of: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        # optimizer -> this engine's backward count at its last step (by anyone): a hand step is refused only
        # when this engine's amp.backward ran since (an engine left behind does not judge later loops)
        self._seen: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._warned_fp32 = False
        self._checked: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._handle = _optim.register_optimizer_step_pre_hook(self._pre_hook)
        weakref.finalize(amp, self._handle.remove)

    def remove(self) -> None:
        """Remove the global hook (idempotent)."""
        self._handle.remove()

    @contextlib.contextmanager
    def engine_steps(self) -> Iterator[None]:
        """Around the engine's own ``optimizer.step()`` calls: the hook lets them through."""
        _stepping[0] += 1
        try:
            yield
        finally:
            _stepping[0] -= 1

    def check_weights(self, amp: "MixedPrecision", optimizer: torch.optim.Optimizer) -> None:
        """FP16 weights under loss scaling refused, low-precision weights warned (:func:`step.check_weights`);
        re-checked only when the optimizer's parameter count changes (``add_param_group``)."""
        count = sum(len(g["params"]) for g in optimizer.param_groups)
        if self._checked.get(optimizer) != count:
            params = _step.params_of([optimizer])
            if amp.config.weights == "bf16-pure":  # asked for by name: the low-precision weights are the point
                params = []
            elif amp.master is not None:  # BF16 weights with their remainders: exact FP32 updates
                params = [p for p in params if not amp.master.covers(p)]
            _step.check_weights(params, amp.precision.name, amp.scaler is not None, stacklevel=5)
            self._checked[optimizer] = count

    # ------------------------------------------------------------------ backward
    def before_backward(self, amp: "MixedPrecision", loss: torch.Tensor) -> None:
        if self._closure_depth and amp.scaler is not None:
            raise UsageError("amp.backward inside an optimizer closure (LBFGS) under FP16: the optimizer calls "
                             "the closure itself and would read gradients and loss multiplied by the loss scale. "
                             "Use MixedPrecision('bf16') or 'fp32' for LBFGS, or loss.backward() in the closure "
                             "under amp.autocast() without loss scaling")
        if amp.steps < TRACE_STEPS and amp._windows.backwards < 8 * TRACE_STEPS * amp.accumulation_steps:
            for p in _leaves(loss):
                self._reached[id(p)] = weakref.ref(p)

    # ------------------------------------------------------------------ the engine's step
    def before_step(self, amp: "MixedPrecision", optimizers: Sequence[torch.optim.Optimizer]) -> None:
        for opt in optimizers:
            self.stepped.add(opt)
            self._seen[opt] = amp._windows.backwards
        if not self._warned_fp32:  # the first step only (the specs are normalised on every read)
            self._warned_fp32 = True
            if amp.config.fp32_specs and amp.fp32_regions is None and amp.precision.autocast_enabled:
                # Refused, not warned: training on would run the declared modules in low precision.
                raise UsageError(f"fp32_modules {list(amp.config.fp32_specs)} is set but amp.attach(model) was "
                                 "not called, so no module would be kept in FP32: call amp.attach(model) once "
                                 "before the first step")
        check_lrs(optimizers)

    def after_step(self, amp: "MixedPrecision", optimizers: Sequence[torch.optim.Optimizer]) -> None:
        for opt in optimizers:
            self.steps_of[opt] = self.steps_of.get(opt, 0) + 1
        if amp.steps == TRACE_STEPS:
            self._warn_orphans()

    def _warn_orphans(self) -> None:
        owned = {id(p) for opt in self.stepped for g in opt.param_groups for p in g["params"]}
        orphans = [p for pid, ref in self._reached.items()
                   if (p := ref()) is not None and pid not in owned and p.requires_grad and p.grad is not None]
        if orphans:
            shapes = ", ".join(str(tuple(p.shape)) for p in orphans[:3])
            warnings.warn(f"ampkit: {len(orphans)} parameter(s) (shapes {shapes}) get gradients from amp.backward "
                          f"but no optimizer stepped them in {TRACE_STEPS} steps: their gradients keep "
                          "accumulating. Pass their optimizer to amp.step (amp.step(opt_a, opt_b)), or freeze "
                          "them (p.requires_grad_(False))", stacklevel=5)

    # ------------------------------------------------------------------ the hook
    def _pre_hook(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Any:
        amp = self._amp()
        if amp is None or _stepping[0]:
            return None
        self.stepped.add(optimizer)
        if amp.scaler is None:
            return None
        if self._seen.get(optimizer, -1) < amp._windows.backwards:
            self._refuse_scaled(amp, optimizer)
        self._seen[optimizer] = amp._windows.backwards
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer
        if closure is None:
            return None
        wrapped = self._watch(closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _watch(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        def watched() -> Any:
            self._closure_depth += 1
            try:
                return closure()
            finally:
                self._closure_depth -= 1
        return watched

    def _refuse_scaled(self, amp: "MixedPrecision", optimizer: torch.optim.Optimizer) -> None:
        if compat.unscaled(amp.scaler, optimizer):
            return  # amp.scaler.unscale_(optimizer) ran: the gradients are true ones
        reached = self._reached
        scaled = [p for g in optimizer.param_groups for p in g["params"]
                  if p.grad is not None and (ref := reached.get(id(p))) is not None and ref() is p]
        if scaled:
            name = type(optimizer).__name__
            raise AmpkitError(
                f"{name}.step() was called by hand on gradients from amp.backward under FP16: they are "
                f"multiplied by the loss scale, so the update would be that many times too large. Step it "
                f"with amp.step(optimizer) (several optimizers on one backward: amp.step(opt_a, opt_b))")
