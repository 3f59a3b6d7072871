"""Run-time instrumentation of a user's training script.

This is the one place in ampkit that instruments a user's process (DESIGN.md, rule 1). Everything
is installed by :class:`Instrumentation` on ``__enter__`` and removed on ``__exit__``; the user's
files are never edited. It installs:

* global module forward pre-hooks and forward hooks (module paths, the non-finite locator, or the
  FP16 range recorder), and tensor gradient hooks registered from them;
* a global optimizer step pre-hook and a wrapper around ``torch.optim.Optimizer.__init__``;
* wrappers around ``Tensor.backward``, ``zero_grad`` and ``LRScheduler.step`` (the order of the loop's calls,
  :mod:`~ampkit.diagnose.order_checks`);
* wrappers around ``torch.amp.GradScaler`` (``__init__``, ``scale``, ``unscale_``, ``step``,
  ``update``), ``clip_grad_norm_`` / ``clip_grad_value_``, ``torch.save``, ``torch.autocast``
  (construction and entry), ``Tensor.half`` / ``Tensor.to`` / ``Module.half``, and the host reads
  ``Tensor.item`` / ``tolist`` / ``__bool__`` / ``__float__`` / ``__int__``.

This module holds the run's shared state, the install/remove orchestration, the module hooks and
the optimizer-step accounting. The wrappers and their checks live by concern:
:mod:`~ampkit.diagnose.scaler_checks` (GradScaler, clipping, checkpoints),
:mod:`~ampkit.diagnose.casts` (autocast and manual casts) and :mod:`~ampkit.diagnose.host_reads`
(host syncs); they are installed only from here.

Device values are read in one batch per optimizer step. The script is stopped after ``steps``
optimizer steps by raising :class:`StopRun` (a ``BaseException``) from the step wrapper.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
import weakref
from typing import Any, Callable

import torch

from ampkit.diagnose.casts import CastChecks
from ampkit.diagnose.clip_watch import ClipWatch
from ampkit.diagnose.findings import Finding
from ampkit.diagnose.fp16range import RangeRecorder, recommended_scale
from ampkit.diagnose.host_reads import SYNC_NAMES, HostReads
from ampkit.diagnose.loop_checks import LoopChecks
from ampkit.diagnose.nonfinite import NonFiniteLocator
from ampkit.diagnose.master_checks import MasterChecks
from ampkit.diagnose.opwatch import OpWatch
from ampkit.diagnose.order_checks import OrderChecks
from ampkit.diagnose.scaler_checks import ScalerChecks, optimizer_params
from ampkit.diagnose.source import line_text
from ampkit.diagnose.stop import StopRun
from ampkit.diagnose.tracking import ModuleTracker, UserCode, is_ampkit_file

__all__ = ["Instrumentation", "StopRun"]


class Instrumentation:
    """Installs every patch of a diagnose run; collects findings.

    ``mode="diagnose"`` looks for defects; ``mode="range"`` forces autocast and GradScaler off and
    records FP16 range statistics (``recorder``) instead.
    """

    def __init__(self, script_dir: str, *, steps: int = 50, mode: str = "diagnose", watch_ops: bool = True) -> None:
        self.user = UserCode(script_dir)
        self.tracker = ModuleTracker(self.user)
        self.mode = mode
        self.max_steps = steps
        self.locator = NonFiniteLocator(self.tracker, self.paused)
        self.recorder = RangeRecorder(self.tracker) if mode == "range" else None
        self.watch: OpWatch | None = OpWatch(mode, self.tracker.name, lambda: self._paused > 0) if watch_ops else None
        if self.recorder is not None and self.watch is not None:
            self.recorder.is_low = self.watch.amp.is_low
            self.watch.amp.quiet = self.paused  # its own autocast must not be forced off like the script's
        self.step = 0
        self.devices_seen: set[str] = set()
        self._findings: dict[tuple, Finding] = {}
        self._paused = 0
        self._in_scaler_step = False
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._step_dtypes: set[tuple[str, torch.dtype]] = set()
        self.step_dtypes_seen: set[tuple[str, torch.dtype]] = set()  # every enabled autocast of the run
        self._scaled_this_step = False
        self._undo: list[Callable[[], None]] = []
        self.scaler_checks = ScalerChecks(self)
        self.cast_checks = CastChecks(self)
        self.host_reads = HostReads(self)
        self.loop_checks = LoopChecks(self)
        self.order_checks = OrderChecks(self)
        self.master_checks = MasterChecks(self)
        self.clip_watch = ClipWatch(self)

    # ------------------------------------------------------------------ results
    @property
    def findings(self) -> list[Finding]:
        return list(self._findings.values())

    def add(self, finding: Finding, key: tuple | None = None) -> None:
        """Keep the first finding per key (default: code and where)."""
        self._findings.setdefault(key or (finding.code, finding.where), finding)

    def source_line(self, where: str | None) -> str:
        """The text of the user's line at ``where`` (``file:line`` as findings name it); '' when unreadable."""
        if not where or ":" not in where:
            return ""
        path, _, line = where.rpartition(":")
        return line_text(path, int(line)) if line.isdigit() else ""

    def has(self, code: str) -> bool:
        return any(f.code == code for f in self._findings.values())

    @contextlib.contextmanager
    def paused(self):
        """Instrumentation off (ampkit's own work, e.g. re-running a module)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # ------------------------------------------------------------------ install / remove
    def __enter__(self) -> "Instrumentation":
        try:
            self._install()
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        had = name in owner.__dict__ if isinstance(owner, type) else hasattr(owner, name)
        raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        orig = getattr(owner, name)
        setattr(owner, name, make(orig))
        self._undo.append(lambda: setattr(owner, name, raw) if had else delattr(owner, name))

    def _install(self) -> None:
        import torch.optim.optimizer as optim_mod

        mm = torch.nn.modules.module
        for handle in (mm.register_module_forward_pre_hook(self._pre_hook),
                       mm.register_module_forward_hook(self._fwd_hook, with_kwargs=True, always_call=True),
                       optim_mod.register_optimizer_step_pre_hook(self._opt_pre_hook),
                       optim_mod.register_optimizer_step_post_hook(self._opt_post_hook)):
            self._undo.append(handle.remove)
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_opt_init)
        scaler, casts = self.scaler_checks, self.cast_checks
        gs = torch.amp.GradScaler
        self._patch(gs, "__init__", scaler.wrap_scaler_init)
        self._patch(gs, "scale", scaler.wrap_scale)
        self._patch(gs, "unscale_", scaler.wrap_unscale)
        self._patch(gs, "step", scaler.wrap_scaler_step)
        self._patch(gs, "update", scaler.wrap_update)
        import torch.nn.utils.clip_grad as clip_mod

        for owner in (torch.nn.utils, clip_mod):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                self._patch(owner, name, scaler.wrap_clip)
        for owner in (torch, torch.serialization):
            self._patch(owner, "save", scaler.wrap_save)
        ac = torch.amp.autocast_mode.autocast
        self._patch(ac, "__init__", casts.wrap_autocast_init)
        self._patch(ac, "__enter__", casts.wrap_autocast_enter)
        if self.mode == "range":
            self._patch(ac, "__exit__", casts.wrap_autocast_exit)
        self._patch(torch.Tensor, "half", casts.wrap_tensor_half)
        self._patch(torch.Tensor, "to", casts.wrap_tensor_to)
        if self.mode == "range":
            self._patch(torch.Tensor, "float", casts.wrap_tensor_float)
            self._patch(torch.Tensor, "type_as", casts.wrap_tensor_type_as)
        self._patch(torch.nn.Module, "half", casts.wrap_module_half)
        for name in ("bfloat16", "to"):
            self._patch(torch.nn.Module, name, casts.wrap_module_low)
        self._patch(torch.nn.functional, "binary_cross_entropy", casts.wrap_bce)
        loop = self.loop_checks
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            self._patch(owner, "zero_grad", loop.wrap_zero_grad)
        self._patch(torch.autograd, "grad", loop.wrap_autograd_grad)
        self._patch(torch.Tensor, "backward", self.order_checks.wrap_backward)
        self._patch(torch.optim.lr_scheduler.LRScheduler, "step", self.order_checks.wrap_scheduler_step)
        for name in SYNC_NAMES:
            self._patch(torch.Tensor, name, self.host_reads.wrap(name))
        self._patch(warnings, "warn", self._wrap_warn)
        self._patch(warnings, "showwarning", self._wrap_showwarning)
        self._undo.append(self.clip_watch.stop)

    # ------------------------------------------------------------------ warnings
    # A warning torch raises with stacklevel=2 from inside a function we wrap would name our wrapper's
    # file; Python warnings skip ampkit's frames, C++ warnings (one level) are re-attributed at display.
    def _wrap_warn(self, orig):
        def warn(message, category=None, stacklevel=1, source=None, **kwargs):
            if torch.compiler.is_compiling():
                return orig(message, category, stacklevel + 1, source, **kwargs)
            f = sys._getframe(1)
            for _ in range(max(0, stacklevel - 1)):
                if f.f_back is None:
                    break
                f = f.f_back
            extra = 0
            while f is not None and is_ampkit_file(f.f_code.co_filename):
                f, extra = f.f_back, extra + 1
            return orig(message, category, stacklevel + extra + 1, source, **kwargs)

        return warn

    def _wrap_showwarning(self, orig):
        user = self.user

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if is_ampkit_file(filename):
                f = user.frame(1)
                if f is not None:
                    filename, lineno, line = f.f_code.co_filename, f.f_lineno, None
            return orig(message, category, filename, lineno, file, line)

        return showwarning

    # ------------------------------------------------------------------ module hooks
    # Both hooks return at once inside a torch.compile'd region: dynamo then traces nothing of ours
    # (no graph breaks, no guards on our state, no recompiles); the compiled module's wrapper
    # (OptimizedModule) runs its hooks eagerly, so its outputs are still checked.
    def _pre_hook(self, module, args):
        if torch.compiler.is_compiling() or self._paused:
            return None
        with self.paused():
            root = self.tracker.enter(module)
            if root:  # the clip watch covers a backward to the step; a forward (the next micro-batch) ends it
                self.clip_watch.stop()
            if root and self.mode == "diagnose" and self.locator.before_root(module):
                self._flush()
            self._watch_enter(module, root)
        return None

    def _fwd_hook(self, module, args, *rest):
        # torch calls a global always_call hook as hook(module, args, result) when forward raised
        # (even one registered with_kwargs), and as hook(module, args, kwargs, output) otherwise.
        if torch.compiler.is_compiling() or self._paused:
            return None
        raised = len(rest) != 2
        with self.paused():
            self.tracker.leave()
            frame = self._watch_leave(module)
            if raised:
                return None
            kwargs, output = rest
            if self.mode == "diagnose":
                call = self.locator.record(module, args, kwargs, output, self.user.where(), self.step)
                if frame is not None:
                    frame.call = call
            else:
                self.recorder.record(module, args, kwargs, output,
                                     fp32=self.tracker.depth == 0 and self.cast_checks.runs_in_fp32(module, args, kwargs))
            dev = _first_device(output)
            if dev is not None:
                self.devices_seen.add(dev)
        return None

    # The op watch (opwatch.py) is pushed at a root module's forward and popped after it: in diagnose
    # mode only when the root runs in FP16/BF16 (autocast or half parameters), in range mode always.
    def _watch_enter(self, module, root: bool) -> None:
        watch = self.watch
        if watch is None:
            return
        compiled = _is_compiled(module)
        if root and not compiled and (self.mode == "range" or _low_precision(module)):
            watch.__enter__()
            watch.active = True
        if watch.active:
            frame = watch.push(module)
            if compiled:  # its forward is dynamo's: keep the mode out of the trace
                frame.suspended = True
                watch.__exit__(None, None, None)

    def _watch_leave(self, module):
        watch = self.watch
        if watch is None or not watch.active:
            return None
        frame = watch.pop()
        if frame is not None and frame.suspended:
            watch.__enter__()
        if self.tracker.depth == 0:
            watch.active = False
            watch.stack.clear()
            watch.__exit__(None, None, None)
        return frame

    def _flush(self) -> None:
        flags = self.watch.take_flags() if self.watch is not None else []
        scale = self.scaler_checks.loss_scale() if self._scaled_this_step else None
        for f in self.locator.flush(report_backward=not self._scaled_this_step, op_flags=flags, loss_scale=scale):
            self.add(f, key=(f.code,))

    def init_scale_hint(self) -> float | None:
        """The FP16 initial loss scale this run calls for: the scale an enabled GradScaler settled at
        (its backoffs found the largest scale without overflow), else the largest unscaled gradient
        at half of FP16's max (capped at 2^16); None when neither can be measured."""
        settled = self.scaler_checks.settled_scale()
        if settled is not None:
            return settled
        grads = [p.grad for o in list(self._optimizers) for p in optimizer_params(o)
                 if p.grad is not None and p.grad.is_floating_point() and p.grad.numel()]
        if not grads:
            return None
        with self.paused(), torch.no_grad():
            dev = grads[0].device
            gmax = float(torch.stack([g.detach().abs().amax().float().to(dev) for g in grads]).amax())
            if not math.isfinite(gmax):  # gradients already ruined: measure them in FP32 instead
                return None
            gmax /= self.scaler_checks.pending_scale()
        return recommended_scale(gmax)

    # ------------------------------------------------------------------ optimizer steps
    def _wrap_opt_init(self, orig):
        inst = self

        def __init__(opt, *args, **kwargs):
            orig(opt, *args, **kwargs)
            inst._optimizers.add(opt)

        return __init__

    def _opt_post_hook(self, optimizer, args, kwargs):
        if self._paused or self.mode != "diagnose":
            return None
        with self.paused():
            self.master_checks.after_step(optimizer)
        return None

    def _opt_pre_hook(self, optimizer, args, kwargs):
        if self._paused or self._in_scaler_step:
            return None
        self._begin_step(optimizer)
        return None

    def _begin_step(self, optimizer) -> None:
        """Before an optimizer step (or a scaler.step that may skip it): read this step's device
        values once, run the per-step checks, count the step; stop when the budget is spent."""
        with self.paused():
            if self.mode == "range":
                if self.step >= self.max_steps:  # the forward/backward of a step not taken: not counted
                    self.recorder.close()
                    raise StopRun(f"stopped after {self.max_steps} optimizer steps")
                self.recorder.record_ops(self.watch.take_maxima() if self.watch is not None else {})
                self.recorder.record_params(optimizer_params(optimizer))
            else:
                self.order_checks.before_step(optimizer)
                self.master_checks.before_step(optimizer)
                if not self._scaled_this_step:
                    self.loop_checks.check_fp16_weights(optimizer)
                self._flush()
                if (not self._scaled_this_step and any(d == torch.float16 for _, d in self._step_dtypes)
                        and not self.has("static-loss-scale")):
                    self.scaler_checks.check_underflow(optimizer)
            self._step_dtypes.clear()
            self._scaled_this_step = False
            if self.step >= self.max_steps:
                raise StopRun(f"stopped after {self.max_steps} optimizer steps")
            self.step += 1

    # ------------------------------------------------------------------ end of run
    def finish(self) -> None:
        """Flush what is pending and turn run-level observations into findings."""
        if self.mode != "diagnose":
            if self.watch is not None:
                self.recorder.record_ops(self.watch.take_maxima())
            return
        with self.paused():
            self._flush()
            if self.locator.scale_pending:
                scale = self.init_scale_hint()
                self._findings = {k: f for k, f in zip(self._findings, self.locator.complete_fixes(
                    list(self._findings.values()), scale))}
        self.host_reads.finish()
        self.scaler_checks.finish()


def _is_compiled(module) -> bool:
    """A ``torch.compile(module)`` wrapper (its forward runs under dynamo)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def _low_precision(module) -> bool:
    """The module runs in FP16/BF16: under an enabled autocast, or with half/bfloat16 parameters."""
    p = next(module.parameters(), None)
    dev = p.device.type if p is not None else "cpu"
    try:
        if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) in (torch.float16, torch.bfloat16):
            return True
    except RuntimeError:  # a backend without autocast
        pass
    if dev != "cpu" and torch.is_autocast_enabled("cpu"):
        return True
    return p is not None and p.dtype in (torch.float16, torch.bfloat16)


def _first_device(output: Any) -> str | None:
    if isinstance(output, torch.Tensor):
        return output.device.type
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0].device.type
    return None
