"""The non-finite locator: the first module, and the aten op inside it, whose output or gradient
became inf/NaN.

Forward: a global forward hook keeps, per module call, an on-device flag "inputs finite, output
finite" and the inputs themselves. Backward: the same hook registers tensor hooks on the call's
outputs and inputs, which record "gradient finite" flags in the order autograd produces them.
Nothing is read on the host until :meth:`NonFiniteLocator.flush` (at the optimizer step, the next
forward of the same root, or the end of the run): one batched read per step.

When a flag is false, the failing module is run once more, on the saved inputs and under the
autocast state it had, inside a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that
stops at the first aten op producing inf/NaN from finite inputs. Buffers and RNG are restored
afterwards, so the user's run is unchanged.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

import torch

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.fixes import cause_fix, keep_fp32_fix, not_precision_fix
from ampkit.diagnose.oplocate import OpHit, first_nonfinite_backward, first_nonfinite_op
from ampkit.diagnose.opwatch import OpFlag
from ampkit.diagnose.tracking import ModuleTracker, tensor_leaves

__all__ = ["NonFiniteLocator", "OpHit", "first_nonfinite_op", "FP16_MAX"]

FP16_MAX = 65504.0


@dataclass
class _Call:
    """One module forward call of the current step."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    outs: list[torch.Tensor]  # floating outputs; checked at the flush, all at once
    autocast: tuple[str, bool, torch.dtype]
    where: str
    step: int
    grads_out: list[torch.Tensor] = field(default_factory=list)
    root: bool = False  # a top-level module: its output is what the loss is made from


@dataclass
class _GradEvent:
    call: _Call
    kind: str  # "in" (gradient w.r.t. an input) or "out" (w.r.t. an output)
    ok: torch.Tensor


class NonFiniteLocator:
    """Records module calls and gradients of one step; :meth:`flush` turns the first non-finite
    one into a finding."""

    def __init__(self, tracker: ModuleTracker, paused: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.tracker = tracker
        self._paused = paused
        self.scale_pending: dict[str, str] = {}  # FP16 keep-in-FP32 fix text -> module, until the scale is known
        self.calls: list[_Call] = []
        self.events: list[_GradEvent] = []
        self._roots_called: set[int] = set()
        self.done = False  # after the first finding, later non-finite values are its consequences
        self.absorbed = False  # an overflow-absorbed finding was made (reported once per run)
        self._last_grad: torch.Tensor | None = None
        self._last_ok: torch.Tensor | None = None
        # (id(module), op) whose inf/NaN a re-run measured in FP32 as well (a mask of -inf): not re-run again
        self.same_in_fp32: set[tuple[int | None, str]] = set()

    # ------------------------------------------------------------------ recording
    def before_root(self, module: torch.nn.Module) -> bool:
        """A root module starts forward; True when the previous step should be flushed first."""
        again = id(module) in self._roots_called
        self._roots_called.add(id(module))
        return again and bool(self.calls or self.events)

    def record(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any, where: str,
               step: int) -> _Call | None:
        if self.done:
            return None
        outs = tensor_leaves(output)
        if not outs:
            return None
        ins = tensor_leaves((args, kwargs))
        dev = outs[0].device
        ac = (dev.type, torch.is_autocast_enabled(dev.type), torch.get_autocast_dtype(dev.type))
        call = _Call(module, args, kwargs, outs, ac, where, step, root=self.tracker.depth == 0)
        self.calls.append(call)
        if torch.is_grad_enabled():
            for t in outs:
                if t.requires_grad:
                    t.register_hook(partial(self._grad_hook, call, "out"))
            for t in ins:
                if t.requires_grad:
                    t.register_hook(partial(self._grad_hook, call, "in"))
        return call

    def _grad_hook(self, call: _Call, kind: str, grad: torch.Tensor) -> None:
        if grad is None or not grad.is_floating_point():
            return
        if grad is not self._last_grad:  # a module's input is often the previous one's output: one check
            with torch.no_grad():
                self._last_grad, self._last_ok = grad, torch.isfinite(grad).all()
        self.events.append(_GradEvent(call, kind, self._last_ok))
        if kind == "out":
            call.grads_out.append(grad)

    def explained(self) -> None:
        """Another finding explains this step's inf/NaN (a static loss scale): what follows is its consequence."""
        self.calls.clear()
        self.events.clear()
        self.done = True

    def reset(self) -> None:
        self.calls.clear()
        self.events.clear()
        self._roots_called.clear()

    # ------------------------------------------------------------------ reading
    def flush(self, *, report_backward: bool = True, op_flags: list[OpFlag] | None = None,
              loss_scale: float | None = None) -> list[Finding]:
        """Read this step's flags (one transfer per device) and return at most one forward and one
        backward finding. ``report_backward=False`` when an enabled GradScaler scaled the loss
        by ``loss_scale``: an inf gradient is then its business (see ``scale-collapse``), unless the
        module's backward re-run on the gradients with the scale divided out is still inf/NaN (a
        structural defect such as the derivative of ``sqrt(0)``). ``op_flags`` are the op watch's
        FP16/BF16 op outputs of the step (``overflow-absorbed``)."""
        calls, events = self.calls, self.events
        op_flags = op_flags or []
        self.calls, self.events = [], []
        self._roots_called.clear()
        self._last_grad = self._last_ok = None
        findings: list[Finding] = []
        if calls or op_flags:
            ok = finite_flags([t for c in calls for t in c.outs] + [f.tensor for f in op_flags])
            outs_ok, pos = [], 0
            for c in calls:
                outs_ok.append(all(ok[pos:pos + len(c.outs)]))
                pos += len(c.outs)
            ops_ok = ok[pos:]
            bad = next((i for i, good in enumerate(outs_ok) if not good), None)
            op_bad = next((i for i, good in enumerate(ops_ok) if not good and op_flags[i].frame.call is not None
                           and (id(op_flags[i].frame.module), op_flags[i].op) not in self.same_in_fp32), None)
            if bad is not None:
                call = calls[bad]
                inputs_ok = _inputs_finite(call)
                if not inputs_ok and op_bad is not None:
                    # The value went bad in functional code between submodules (e.g. the scores of an
                    # attention block): the op watch names the module whose own forward ran that op.
                    origin = op_flags[op_bad].frame.call
                    if any(c is origin for c in calls) and _inputs_finite(origin):
                        call, inputs_ok = origin, True
                # A module may hand on inf/NaN by design (masked scores); it breaks training only when a
                # top-level output (what the loss is made from) is inf/NaN.
                breaks = any(c.root and not good for c, good in zip(calls, outs_ok))
                found = self._forward_finding(call, inputs_ok, breaks)
                if found is not None:
                    findings.append(found)
                    self.done = True
                    return findings
            if op_bad is not None and not self.absorbed:
                found = self._absorbed_finding(op_flags[op_bad])
                if found is not None:
                    findings.append(found)
                    self.absorbed = True
        if events and (report_backward or loss_scale):
            oks = _read([e.ok for e in events])
            bad = next((i for i, ok in enumerate(oks) if not ok), None)
            if bad is not None:
                found = self._backward_finding(events[_producer(events, oks, bad)],
                                               None if report_backward else loss_scale)
                if found is not None:
                    findings.append(found)
                    self.done = True
        return findings

    def _where(self, call: _Call, hit: OpHit | None = None, module: torch.nn.Module | None = None) -> str:
        """``model.attn · attn.py:27``: the module path and the user's line of the failing op (the re-run
        found it); else the line that called the module plus where its ``forward`` is defined."""
        name = self.tracker.name(module if module is not None else call.module)
        if hit is not None and hit.where:
            return f"{name} · {hit.where}"
        text = f"{name} · {call.where}"
        fwd = getattr(type(call.module).forward, "__code__", None)
        if fwd is not None and self.tracker.user.is_user_file(fwd.co_filename):
            text += f" (forward defined at {os.path.basename(fwd.co_filename)}:{fwd.co_firstlineno})"
        return text

    @staticmethod
    def _called(call: _Call, hit: OpHit | None) -> str:
        return f" (the module was called at {call.where})" if hit is not None and hit.where else ""

    def _forward_finding(self, call: _Call, inputs_finite: bool, breaks: bool = True) -> Finding | None:
        """The finding for a module output that holds inf/NaN: an AMP finding when a re-run measured that
        precision made it (FP32 gives finite values there); else, when it reaches a top-level output
        (``breaks``), a note that it is not a precision problem; else None (inf/NaN by design, e.g. a mask)."""
        who = self.tracker.describe(call.module)
        if not inputs_finite:
            if not breaks:
                return None
            return Finding(
                code="nonfinite-forward",
                message=f"the input of {who} was already inf/NaN when it was called: the non-finite value "
                        "came from the data or from code outside any module",
                where=self._where(call), fix="check the batch with `torch.isfinite(x).all()` before the "
                "forward, and the functional code between modules; " + fix_for("nonfinite-forward"),
                step=call.step)
        hit = self._rerun(call, backward=False)
        if hit is not None and not hit.precision:
            return self._not_precision(call, hit) if breaks else None
        dt, enabled, dtype = call.autocast
        region = f" under {dt} autocast to {str(dtype).replace('torch.', '')}" if enabled else ""
        detail = f" at {hit.describe()}" if hit else ""
        module, where = call.module, self._where(call, hit)
        message = f"the output of {who} became inf/NaN{region}{detail}{self._called(call, hit)}"
        if hit is not None and hit.module is not None and hit.module is not getattr(module, "_orig_mod", module):
            # Inside a torch.compile'd model (its submodules' hooks do not run there) the re-run names
            # the innermost module that ran the op.
            module = hit.module
            where = self._where(call, hit, module) if hit.where else f"{self.tracker.name(module)} · {call.where}"
            message = (f"the output of {who} became inf/NaN{region}; it starts in {self.tracker.describe(module)} "
                       f"at {hit.describe()}{self._called(call, hit)}")
        first = cause_fix(hit.cause, hit.detail) if hit is not None else ""
        return Finding(code="nonfinite-forward", message=message, where=where,
                       fix=first + _keep_fp32(self, call, module=module), step=call.step)

    def _not_precision(self, call: _Call, hit: OpHit) -> Finding:
        """A forward inf/NaN that reaches the loss although FP32 gives it too: named, not blamed on AMP."""
        return Finding(
            code="nonfinite-forward",
            message=f"the output of {self.tracker.describe(call.module)} became inf/NaN at `{hit.op}` ({hit.out_dtype}); "
                    "measured: the same op on the same inputs gives inf/NaN in FP32 too, so precision did not cause "
                    f"it and turning AMP off will not fix it{self._called(call, hit)}",
            where=self._where(call, hit), fix=not_precision_fix(), step=call.step)

    def _absorbed_finding(self, flag: OpFlag) -> Finding | None:
        """``overflow-absorbed`` when a re-run measures that precision made the op's inf/NaN; None when FP32
        gives the same (a mask of -inf that softmax turns into 0), and that op is not re-run again."""
        call = flag.frame.call
        who = self.tracker.describe(call.module)
        seen: set = set()
        hit = self._rerun(call, backward=False, same_in_fp32=seen)
        if hit is None or not hit.precision:
            self.same_in_fp32 |= seen
            self.same_in_fp32.add((id(flag.frame.module), flag.op))
            return None
        dt, enabled, dtype = call.autocast
        region = f" under {dt} autocast to {str(dtype).replace('torch.', '')}" if enabled else ""
        op = hit.describe() if hit else f"`{flag.op}` ({str(flag.dtype).replace('torch.', '')})"
        return Finding(
            code="overflow-absorbed",
            message=f"an op inside {who}{region} produced inf/NaN while the module's output stayed finite: "
                    f"{op}. A later op absorbed it (e.g. `x / inf` = 0), so the loss looks normal, the "
                    f"GradScaler never skips, and the result is silently wrong{self._called(call, hit)}",
            where=self._where(call, hit),
            fix=_keep_fp32(self, call, measure_scale=True), step=call.step)

    def _backward_finding(self, event: _GradEvent, loss_scale: float | None = None) -> Finding | None:
        """The finding for a non-finite gradient; with ``loss_scale`` (a GradScaler scaled the loss) only
        when the re-run on the unscaled gradients still gives inf/NaN, else None (the scaler skips it)."""
        call = event.call
        who = self.tracker.describe(call.module)
        if loss_scale is not None:
            if event.kind == "out":
                return None
            hit = self._rerun(call, backward=True, grad_scale=1.0 / loss_scale)
            if hit is None or not hit.inputs_finite:
                return None
            return Finding(
                code="nonfinite-backward",
                message=f"the backward of {who} turned finite gradients into inf/NaN at {hit.describe()}; not the loss "
                        f"scale: with the scale ({loss_scale:g}) divided out it is still inf/NaN, so the GradScaler "
                        f"skips every such step (the line is the forward op whose backward failed; the module was "
                        f"called at {call.where})",
                where=self._where(call, hit), fix=cause_fix(hit.cause, hit.detail) + fix_for("nonfinite-backward"),
                step=call.step)
        if event.kind == "out":
            return Finding(
                code="nonfinite-backward",
                message=f"the gradient arriving at the output of {who} was already inf/NaN: it came from the "
                        "loss or from code after this module",
                where=self._where(call), fix=fix_for("nonfinite-backward"), step=call.step)
        hit = self._rerun(call, backward=True)
        detail = f" at {hit.describe()}" if hit else ""
        return Finding(
            code="nonfinite-backward",
            message=f"the backward of {who} turned finite gradients into inf/NaN{detail}"
                    + (f" (the line is the forward op whose backward failed; the module was called at {call.where})"
                       if hit is not None and hit.where else ""),
            where=self._where(call, hit), step=call.step,
            fix=(cause_fix(hit.cause, hit.detail) if hit is not None else "") + fix_for("nonfinite-backward"))

    def complete_fixes(self, findings: list[Finding], init_scale: float | None) -> list[Finding]:
        """The FP16 keep-in-FP32 fixes with the initial loss scale the run showed (None: not known)."""
        if init_scale is None:
            return findings
        return [replace(f, fix=keep_fp32_fix(self.scale_pending[f.fix], init_scale)) if f.fix in self.scale_pending
                else f for f in findings]

    # ------------------------------------------------------------------ re-running one module
    def _rerun(self, call: _Call, *, backward: bool, grad_scale: float = 1.0,
               same_in_fp32: set | None = None) -> OpHit | None:
        """Run the module again on its saved inputs (same autocast state) and find the first bad op."""
        module = getattr(call.module, "_orig_mod", call.module)  # a compiled model re-runs eagerly
        dev_type, enabled, dtype = call.autocast
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
        devices = [torch.device(dev_type).index or 0] if dev_type not in ("cpu", "meta") else []
        try:
            with self._paused(), torch.random.fork_rng(devices=devices, device_type=dev_type if devices else "cuda"):
                args, kwargs = _detach((call.args, call.kwargs), requires_grad=backward)
                if not backward:
                    with torch.no_grad(), torch.autocast(dev_type, dtype=dtype, enabled=enabled):
                        return first_nonfinite_op(lambda: module(*args, **kwargs), self.tracker.user,
                                                  same_in_fp32=same_in_fp32)

                def forward():
                    with torch.enable_grad(), torch.autocast(dev_type, dtype=dtype, enabled=enabled):
                        return module(*args, **kwargs)

                ins = [t for t in tensor_leaves((args, kwargs)) if t.requires_grad]
                grads = [g * grad_scale for g in call.grads_out] if grad_scale != 1.0 else call.grads_out
                return first_nonfinite_backward(forward, ins, grads, self.tracker.user)
        except Exception:  # noqa: BLE001 - user code of any kind: a module that cannot be re-run still gets its finding
            return None
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def _keep_fp32(locator: NonFiniteLocator, call: _Call, *, measure_scale: bool = False,
               module: torch.nn.Module | None = None) -> str:
    """The fix naming the module. With FP16 and ``measure_scale`` (the forward stays finite, so the
    run's gradients and GradScaler mean something), :meth:`NonFiniteLocator.complete_fixes` adds the
    initial loss scale at the end of the run; otherwise the fix points to ``--fp16-range`` for it."""
    _, enabled, dtype = call.autocast
    fp16 = dtype == torch.float16 if enabled else any(p.dtype == torch.float16 for p in call.module.parameters())
    name = locator.tracker.relative_name(module if module is not None else call.module)
    fix = keep_fp32_fix(name, None, fp16=fp16)
    if fp16 and measure_scale:
        locator.scale_pending[fix] = name
    return fix


def _producer(events: list[_GradEvent], oks: list[bool], first_bad: int) -> int:
    """The event that names the module whose backward made the gradient non-finite: the first bad
    gradient w.r.t. a module's *input* while the gradients w.r.t. its outputs were finite. Hooks on
    one tensor fire in registration order, so the producing module's "out" event can come first."""
    for i in range(first_bad, len(events)):
        e = events[i]
        if e.kind == "in" and not oks[i]:
            outs = [oks[j] for j in range(i) if events[j].call is e.call and events[j].kind == "out"]
            if all(outs):
                return i
    return first_bad


def _detach(obj, *, requires_grad: bool):
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if requires_grad and obj.is_floating_point() and obj.requires_grad:
            t = t.clone().requires_grad_(True)
        return t
    if isinstance(obj, tuple):
        return tuple(_detach(o, requires_grad=requires_grad) for o in obj)
    if isinstance(obj, list):
        return [_detach(o, requires_grad=requires_grad) for o in obj]
    if isinstance(obj, dict):
        return {k: _detach(v, requires_grad=requires_grad) for k, v in obj.items()}
    return obj


def _inputs_finite(call: _Call) -> bool:
    return all(finite_flags(tensor_leaves((call.args, call.kwargs))))


def finite_flags(tensors: list[torch.Tensor]) -> list[bool]:
    """Whether each tensor is all finite, read with one transfer per device: the max-norm of each
    (inf/NaN propagate) in one ``_foreach_norm`` per (device, dtype), instead of two ops per tensor."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    flags: list[torch.Tensor] = [None] * len(groups)  # type: ignore[list-item]
    order: list[list[int]] = []
    with torch.no_grad():
        for g, ((dev, _), idx) in enumerate(groups.items()):
            norms = torch._foreach_norm([tensors[i].detach() for i in idx], float("inf"))
            flags[g] = torch.isfinite(torch.stack(norms))
            order.append(idx)
    out: list[bool] = [True] * len(tensors)
    for idx, values in zip(order, _read(flags)):
        for i, v in zip(idx, values):
            out[i] = bool(v)
    return out


def _read(flags: list[torch.Tensor]) -> list:
    """Read many small device tensors with one transfer per device, keeping their order (a 0-d flag
    reads as a bool, a 1-d one as a list)."""
    by_dev: dict[torch.device, list[int]] = {}
    for i, f in enumerate(flags):
        by_dev.setdefault(f.device, []).append(i)
    out: list = [None] * len(flags)
    for idx in by_dev.values():
        values = torch.cat([flags[i].reshape(-1) for i in idx]).cpu().tolist()
        pos = 0
        for i in idx:
            n = flags[i].numel()
            out[i] = values[pos] if flags[i].dim() == 0 else values[pos:pos + n]
            pos += n
    return out
