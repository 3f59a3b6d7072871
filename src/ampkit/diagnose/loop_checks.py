"""Checks of how a training loop drives the optimizer and the GradScaler, across calls.

:class:`LoopChecks` is fed by the wrappers :class:`~ampkit.diagnose.instrument.Instrumentation`
installs (``zero_grad``, ``GradScaler.scale/step/update``, ``torch.autograd.grad``, ``Module.half``) and
finds:

* ``accumulation-steps-every-microbatch``: an enabled GradScaler steps an optimizer whose gradients
  were not cleared since its previous step, two steps in a row: gradients summed over micro-batches
  (usually of an undivided loss) are applied at every micro-batch;
* ``scaler-updated-twice``: one GradScaler updated twice between two steps of the same optimizer (one
  scaler shared by two models, ``update()`` after each): its scale moves twice as fast and a skip
  decided for one model lands on the other;
* ``grad-penalty-not-unscaled``: ``torch.autograd.grad`` of a ``scaler.scale(...)`` output (a WGAN-GP
  gradient penalty) whose gradients reach the loss without being multiplied by ``1 / scale``;
* ``fp16-weights-without-master``: an optimizer steps FP16 parameters with no GradScaler, the model
  made FP16 by ``.half()`` at a line of the script.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING

import torch
from torch.compiler import is_compiling

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.tracking import frame_where

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["LoopChecks"]

_GRAPH_LIMIT = 50_000


def _params(optimizer) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


class LoopChecks:
    """The cross-call loop checks of one run (see the module docstring)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._zeroed: set[int] = set()            # id(param) cleared by a zero_grad since its optimizer's step
        self._stepped: dict[int, tuple[list, int]] = {}  # id(opt) -> (weakrefs to its grads at the step, streak)
        self._updates: dict[int, dict[int, list[str]]] = {}  # id(scaler) -> id(opt) -> update lines since its step
        self._scaled: dict[int, weakref.ref] = {}         # tensors returned by scaler.scale (by id: no __eq__)
        self._penalty: dict[int, tuple[str, float]] = {}   # id(grad_fn) of autograd.grad results -> (where, scale)
        self._penalty_nodes: list = []                     # keeps those nodes alive until the loss is scaled
        self._half: list[tuple[weakref.ref, str]] = []     # modules made FP16 by .half(), and the line
        self._undivided = False

    def _active(self) -> bool:
        return not is_compiling() and not self.inst._paused and self.inst.mode == "diagnose"

    # ------------------------------------------------------------------ gradient clearing and accumulation
    def wrap_zero_grad(self, orig):
        checks = self

        def zero_grad(obj, *args, **kwargs):
            if checks._active():
                params = list(obj.parameters()) if isinstance(obj, torch.nn.Module) else _params(obj)
                checks._zeroed.update(id(p) for p in params)
                with checks.inst.paused():
                    checks.inst.order_checks.note_zero_grad(params)
            return orig(obj, *args, **kwargs)

        return zero_grad

    def note_scaled_loss(self, loss) -> None:
        """``scaler.scale(loss)``: whether the loss was divided (an accumulation count), and the penalty check."""
        if not isinstance(loss, torch.Tensor):
            return
        fn = loss.grad_fn
        self._undivided = fn is None or "Div" not in fn.name()
        if self._penalty:
            self._check_penalty(loss)

    def note_scaler_step(self, scaler, optimizer) -> None:
        """Before ``scaler.step(optimizer)`` of an enabled scaler."""
        inst = self.inst
        params = [p for p in _params(optimizer) if p.grad is not None]
        key = id(optimizer)
        prev = self._stepped.get(key)
        kept = (prev is not None and params and not any(id(p) in self._zeroed for p in params)
                and all(any(r() is p.grad for r in prev[0]) for p in params[:8]))
        streak = prev[1] + 1 if kept else 0
        self._stepped[key] = ([weakref.ref(p.grad) for p in params[:8]], streak)
        self._zeroed.difference_update(id(p) for p in _params(optimizer))
        if streak >= 2:
            loss = ("the loss was not divided by the number of micro-batches, so each step applies up to N times the "
                    "gradient" if self._undivided else "each step applies a partial sum")
            inst.add(Finding(
                code="accumulation-steps-every-microbatch",
                message=f"`scaler.step` stepped the optimizer {streak + 1} times in a row on gradients that were never "
                        "cleared in between (no `zero_grad` between the steps): the gradients accumulate over "
                        f"micro-batches but the update is applied at every micro-batch; {loss}",
                where=inst.user.where(2), fix=fix_for("accumulation-steps-every-microbatch"), step=inst.step),
                key=("accumulation-steps-every-microbatch",))
        updates = self._updates.setdefault(id(scaler), {})
        since = updates.get(key)
        if since is not None and len(since) >= 2 and len(updates) >= 2:
            inst.add(Finding(
                code="scaler-updated-twice",
                message=f"one GradScaler is updated {len(since)} times between two steps of the same optimizer (it is "
                        f"shared by {len(updates)} optimizers and `update()` runs after each): the scale grows and "
                        "backs off twice as fast, and an overflow in one model's step lowers the scale for the other",
                where=since[0], fix=fix_for("scaler-updated-twice"), step=inst.step), key=("scaler-updated-twice",))
        updates[key] = []

    def note_update(self, scaler) -> None:
        """``scaler.update()`` of an enabled scaler."""
        where = self.inst.user.where(2)
        for lines in self._updates.setdefault(id(scaler), {}).values():
            lines.append(where)

    # ------------------------------------------------------------------ gradient penalty
    def note_scale_output(self, out) -> None:
        if isinstance(out, torch.Tensor):
            self._scaled = {k: r for k, r in self._scaled.items() if r() is not None}
            self._scaled[id(out)] = weakref.ref(out)

    def wrap_autograd_grad(self, orig):
        checks = self

        def grad(outputs, inputs, *args, **kwargs):
            result = orig(outputs, inputs, *args, **kwargs)
            if checks._active():
                outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or ())
                if any(isinstance(o, torch.Tensor) and checks._is_scaled(o) for o in outs):
                    with checks.inst.paused():
                        checks._note_penalty(result)
            return result

        return grad

    def _is_scaled(self, t: torch.Tensor) -> bool:
        ref = self._scaled.get(id(t))
        return ref is not None and ref() is t

    def _note_penalty(self, grads) -> None:
        inst = self.inst
        scaler = next((s for s, _ in inst.scaler_checks._enabled_scalers()), None)
        if scaler is None:
            return
        scale = float(scaler.get_scale())
        f = inst.user.frame(2)
        where = frame_where(f) if f is not None else "(not in the script's code)"
        for g in grads if isinstance(grads, (tuple, list)) else (grads,):
            if isinstance(g, torch.Tensor) and g.grad_fn is not None:
                self._penalty[id(g.grad_fn)] = (where, scale)
                self._penalty_nodes.append(g.grad_fn)

    def _check_penalty(self, loss: torch.Tensor) -> None:
        hit = self._scaled_path(loss)
        self._penalty.clear()
        self._penalty_nodes.clear()
        if hit is None:
            return
        where, scale = hit
        self.inst.add(Finding(
            code="grad-penalty-not-unscaled",
            message=f"`torch.autograd.grad` of a `scaler.scale(...)` output returns gradients multiplied by the loss "
                    f"scale ({scale:g}), and they reach the loss without being divided by it: a gradient penalty "
                    f"built from them is off by the scale (squared: {scale * scale:.3g}x for ||grad||^2)",
            where=where, fix=fix_for("grad-penalty-not-unscaled"), step=self.inst.step),
            key=("grad-penalty-not-unscaled",))

    def _scaled_path(self, loss: torch.Tensor) -> tuple[str, float] | None:
        """A path from ``loss`` to an ``autograd.grad`` result that multiplies by nothing like ``1/scale``."""
        todo = deque([(loss.grad_fn, False)])
        seen: set[tuple[int, bool]] = set()
        alive: list = []
        while todo and len(seen) < _GRAPH_LIMIT:
            node, unscaled = todo.popleft()
            if node is None or (id(node), unscaled) in seen:
                continue
            seen.add((id(node), unscaled))
            alive.append(node)  # a freed node's id could be reused by a later node and read as seen
            hit = self._penalty.get(id(node))
            if hit is not None:
                if not unscaled:
                    return hit
                continue
            unscaled = unscaled or any(_unscales(node, s) for _, s in self._penalty.values())
            todo.extend((n, unscaled) for n, _ in node.next_functions if n is not None)
        return None

    # ------------------------------------------------------------------ FP16 weights
    def note_half(self, module: torch.nn.Module) -> None:
        f = self.inst.user.caller_is_user(2)
        if f is not None:
            self._half.append((weakref.ref(module), frame_where(f)))

    def half_line(self, params: list[torch.Tensor]) -> str | None:
        """The user's line that made ``params`` FP16: ``model.half()`` on a module holding one of them, or a cast
        of a tensor whose storage one of them holds (``w.data = w.data.half()``); None when the run saw neither."""
        ids = {id(p) for p in params}
        where = next((w for ref, w in self._half if ref() is not None and any(id(p) in ids for p in ref().parameters())),
                     None)
        return where or self.inst.cast_checks.fp16_cast_line(params)

    def check_fp16_weights(self, optimizer) -> None:
        """At an optimizer step with no enabled GradScaler: FP16 parameters are the only copy of the weights."""
        inst = self.inst
        half = [p for p in _params(optimizer) if p.dtype == torch.float16]
        if not half or inst.has("fp16-weights-without-master"):
            return
        where = self.half_line(half) or inst.user.where(2)
        inst.add(Finding(
            code="fp16-weights-without-master",
            message=f"{len(half)} of {len(_params(optimizer))} parameters the optimizer updates are FP16 (`.half()`), with "
                    "no GradScaler and no FP32 master copy: updates smaller than the weights' rounding step are lost, "
                    "small gradients flush to zero, and a large one overflows to inf",
            where=where, fix=fix_for("fp16-weights-without-master"), step=inst.step), key=("fp16-weights-without-master",))


def _unscales(node, scale: float) -> bool:
    """``node`` multiplies by about ``1/scale`` (``g * inv_scale``) or divides by about ``scale``."""
    name = node.name()
    if not (name.startswith("MulBackward") or name.startswith("DivBackward")):
        return False
    for attr in ("_saved_other", "_saved_self"):
        try:
            v = getattr(node, attr)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v)
        if not isinstance(v, (int, float)) or v == 0:
            continue
        factor = v * scale if name.startswith("Mul") else scale / v
        if abs(factor - 1.0) < 1e-3:
            return True
    return False
