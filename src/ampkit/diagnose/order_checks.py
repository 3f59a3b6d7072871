"""The order of a training loop's calls, observed: backward, zero_grad, the optimizer step, the scheduler.

:class:`OrderChecks` is fed by wrappers :class:`~ampkit.diagnose.instrument.Instrumentation` installs
(``Tensor.backward``, ``zero_grad``, ``LRScheduler.step``) and by each attempted optimizer step
(``optimizer.step`` or ``scaler.step``, skipped or not). It finds:

* ``zero-grad-between-backward-and-step``: a ``zero_grad`` cleared gradients a backward had produced, and
  the next step of that optimizer sees none (all None or all zero);
* ``scheduler-every-microbatch``: ``scheduler.step()`` ran two or more times between two attempted steps of
  its optimizer (skipped steps count: a GradScaler's skip is no reason), with a backward between them: under gradient accumulation the schedule runs per
  micro-batch, N times too fast;
* ``static-loss-scale``: ``backward()`` of a loss multiplied by a constant (``(loss * 1e5).backward()``)
  under FP16 with no enabled GradScaler, and the gradients it gives are inf/NaN: nothing skips the step.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.compiler import is_compiling

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.tracking import frame_where

if TYPE_CHECKING:
    from types import FrameType

    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["OrderChecks", "constant_factor"]

_MIN_STATIC_SCALE = 2.0


def _params(optimizer) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def constant_factor(t: torch.Tensor) -> float | None:
    """The constant ``t`` was multiplied by last (``loss * 1e5`` -> 1e5; ``loss / 0.01`` -> 100), or None
    when its last op is not a multiply or divide by a constant."""
    fn = t.grad_fn
    name = fn.name() if fn is not None else ""
    if not (name.startswith("MulBackward") or name.startswith("DivBackward")):
        return None
    for attr in ("_saved_other", "_saved_self") if name.startswith("Mul") else ("_saved_other",):
        try:
            v = getattr(fn, attr)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or v.requires_grad:
                continue
            v = float(v)
        if isinstance(v, (int, float)) and v != 0:
            return float(v) if name.startswith("Mul") else 1.0 / float(v)
    return None


@dataclass
class _Sched:
    calls: int = 0          # scheduler.step() since its optimizer's last attempted step
    with_backward: int = 0  # ... of which a backward ran before (since the previous call)
    backwards: int = -1     # the run's backward count at the last call
    window: int = -1        # the optimizer's attempted-step count the calls belong to
    where: str = ""


class OrderChecks:
    """The call-order checks of one run (see the module docstring)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._backward_since_step = False
        self._backwards = 0
        self._cleared: dict[int, str] = {}   # id(param) -> the zero_grad line that cleared a fresh gradient
        self._attempts: dict[int, int] = {}  # id(optimizer) -> attempted steps
        self._scheds: dict[int, tuple[object, _Sched]] = {}

    def _active(self) -> bool:
        return not is_compiling() and not self.inst._paused and self.inst.mode == "diagnose"

    # ------------------------------------------------------------------ backward
    def wrap_backward(self, orig):
        checks = self

        def backward(t, *args, **kwargs):
            static = None
            if checks._active():
                with checks.inst.paused():
                    static = checks._static_scale(t)
            if checks._active():
                checks.inst.clip_watch.stop()
            result = orig(t, *args, **kwargs)
            if checks._active():
                checks.inst.clip_watch.after_backward(checks.inst.user.frame(1))
                checks._backward_since_step = True
                checks._backwards += 1
                if static is not None:
                    with checks.inst.paused():
                        checks._check_static(*static)
            return result

        return backward

    def _static_scale(self, t: torch.Tensor) -> tuple[float, str] | None:
        """``(factor, line of the multiply)`` when ``t`` is a loss multiplied by a constant >= 2 under FP16 with
        no enabled GradScaler; else None."""
        inst = self.inst
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or inst.loop_checks._is_scaled(t):
            return None
        factor = constant_factor(t)
        if factor is None or abs(factor) < _MIN_STATIC_SCALE or inst.scaler_checks._enabled_scalers():
            return None
        fp16 = any(d == torch.float16 for _, d in inst._step_dtypes) or any(
            p.dtype == torch.float16 for o in list(inst._optimizers) for p in _params(o))
        if not fp16:
            return None
        f = inst.user.frame(1)
        return factor, _multiply_line(f, t) if f is not None else "(not in the script's code)"

    def _check_static(self, factor: float, where: str) -> None:
        inst = self.inst
        grads = [p.grad for o in list(inst._optimizers) for p in _params(o)
                 if p.grad is not None and p.grad.is_floating_point()]
        if not grads:
            return
        with torch.no_grad():
            bad = int(torch.stack([(~torch.isfinite(g)).any().to(grads[0].device) for g in grads]).sum())
        if not bad:
            return
        inst.add(Finding(
            code="static-loss-scale",
            message=f"the loss is multiplied by a constant {factor:g} before `backward()` under FP16 with no GradScaler "
                    f"(a hand-rolled static loss scale), and the backward overflowed: {bad} of {len(grads)} gradients "
                    "are inf/NaN; nothing skips such a step, so the optimizer writes inf/NaN into the weights (every "
                    "later forward is NaN); a constant scale cannot back off when gradients grow",
            where=where, fix=fix_for("static-loss-scale"), step=inst.step), key=("static-loss-scale",))
        inst.locator.explained()  # the non-finite gradients and forwards that follow are its consequences

    # ------------------------------------------------------------------ zero_grad
    def note_zero_grad(self, params: list[torch.Tensor]) -> None:
        """A ``zero_grad`` (called by the user's code) is about to clear ``params``."""
        if not self._backward_since_step:
            return
        fresh = [p for p in params if p.grad is not None]
        if not fresh:
            return
        where = self.inst.user.where()
        for p in fresh:
            self._cleared.setdefault(id(p), where)

    # ------------------------------------------------------------------ scheduler
    def wrap_scheduler_step(self, orig):
        checks = self

        def step(scheduler, *args, **kwargs):
            # The scheduler's own first step (from its __init__) and a SequentialLR's inner calls are not
            # the user's: only a call made directly by the script counts.
            if checks._active() and checks.inst.user.caller_is_user(1) is not None:
                checks._note_scheduler(scheduler)
            return orig(scheduler, *args, **kwargs)

        return step

    def _note_scheduler(self, scheduler) -> None:
        opt = getattr(scheduler, "optimizer", None)
        if opt is None:
            return
        _, st = self._scheds.setdefault(id(scheduler), (scheduler, _Sched()))
        window = self._attempts.get(id(opt), 0)
        if st.window != window:
            st.calls, st.with_backward, st.window = 0, 0, window
        if st.calls and self._backwards > st.backwards:
            st.with_backward += 1
        st.calls += 1
        st.backwards = self._backwards
        st.where = self.inst.user.where()

    # ------------------------------------------------------------------ the step
    def before_step(self, optimizer) -> None:
        """An attempted step of ``optimizer`` (``optimizer.step`` or ``scaler.step``, before it runs)."""
        inst = self.inst
        params = _params(optimizer)
        where = next((self._cleared[id(p)] for p in params if id(p) in self._cleared), None)
        if where is not None:
            self._check_cleared(optimizer, params, where)
        for p in params:
            self._cleared.pop(id(p), None)
        self._backward_since_step = False
        attempts = self._attempts.get(id(optimizer), 0)
        for sched, st in list(self._scheds.values()):
            # A window between two steps (not the one before the first step, which a late start can shorten).
            if getattr(sched, "optimizer", None) is optimizer and st.window == attempts >= 1 \
                    and st.calls >= 2 and st.with_backward >= 1:
                inst.add(Finding(
                    code="scheduler-every-microbatch",
                    message=f"`scheduler.step()` ran {st.calls} times between two steps of its optimizer, with a "
                            f"backward between the calls: under gradient accumulation the learning-rate schedule "
                            f"advances per micro-batch, {st.calls} times too fast (a schedule planned for the run "
                            f"ends after 1/{st.calls} of it)",
                    where=st.where, fix=fix_for("scheduler-every-microbatch"), step=inst.step),
                    key=("scheduler-every-microbatch",))
        self._attempts[id(optimizer)] = attempts + 1

    def _check_cleared(self, optimizer, params: list[torch.Tensor], where: str) -> None:
        inst = self.inst
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            with torch.no_grad():
                if bool(torch.stack([g.detach().abs().amax().float().to(grads[0].device) for g in grads]).amax() > 0):
                    return
        inst.add(Finding(
            code="zero-grad-between-backward-and-step",
            message=f"`zero_grad()` at {where} cleared the gradients the backward had just produced, before the "
                    f"optimizer step: the step sees {'no gradients (all None)' if not grads else 'all-zero gradients'}, "
                    "so nothing is learned"
                    + (" (and `scaler.step` fails with \"No inf checks were recorded\")" if not grads else ""),
            where=where, fix=fix_for("zero-grad-between-backward-and-step"), step=inst.step),
            key=("zero-grad-between-backward-and-step",))


_ASSIGN = r"^\s*(?:{names})\s*(?::[^=]*)?=[^=]"


def _multiply_line(f: FrameType, t: torch.Tensor) -> str:
    """The line of ``f`` where ``t`` (the multiplied loss) was made: the backward's own line when the multiply is
    on it (``(loss * S).backward()``), else the nearest line above that assigns a name ``t`` is bound to."""
    filename, line = f.f_code.co_filename, f.f_lineno
    here = frame_where(f)
    text = linecache.getline(filename, line)
    if re.search(r"[*/]", text):
        return here
    names = [k for k, v in f.f_locals.items() if v is t]
    if not names:
        return here
    pattern = re.compile(_ASSIGN.format(names="|".join(map(re.escape, names))))
    for n in range(line - 1, max(f.f_code.co_firstlineno, line - 200) - 1, -1):
        src = linecache.getline(filename, n)
        if pattern.match(src) and re.search(r"[*/]", src):
            return f"{here.rsplit(':', 1)[0]}:{n}"
    return here
