"""Run-time instrumentation of a user's training script.

This is the one place in ampkit that instruments a user's process (DESIGN.md, rule 1). Everything
is installed by :class:`Instrumentation` on ``__enter__`` and removed on ``__exit__``; the user's
files are never edited. It installs:

* global module forward pre-hooks and forward hooks (module paths, the non-finite locator, or the
  FP16 range recorder), and tensor gradient hooks registered from them;
* a global optimizer step pre-hook and a wrapper around ``torch.optim.Optimizer.__init__``;
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
import weakref
from typing import Any, Callable

import torch

from ampkit.diagnose.casts import CastChecks
from ampkit.diagnose.findings import Finding
from ampkit.diagnose.fp16range import RangeRecorder
from ampkit.diagnose.host_reads import SYNC_NAMES, HostReads
from ampkit.diagnose.nonfinite import NonFiniteLocator
from ampkit.diagnose.scaler_checks import ScalerChecks, optimizer_params
from ampkit.diagnose.tracking import ModuleTracker, UserCode

__all__ = ["Instrumentation", "StopRun"]


class StopRun(BaseException):
    """Raised inside the script to stop it (step budget reached, or a finding that ends the run).

    A BaseException so that the script's ``except Exception`` blocks do not swallow it.
    """


class Instrumentation:
    """Installs every patch of a diagnose run; collects findings.

    ``mode="diagnose"`` looks for defects; ``mode="range"`` forces autocast and GradScaler off and
    records FP16 range statistics (``recorder``) instead.
    """

    def __init__(self, script_dir: str, *, steps: int = 50, mode: str = "diagnose") -> None:
        self.user = UserCode(script_dir)
        self.tracker = ModuleTracker(self.user)
        self.mode = mode
        self.max_steps = steps
        self.locator = NonFiniteLocator(self.tracker, self.paused)
        self.recorder = RangeRecorder(self.tracker) if mode == "range" else None
        self.step = 0
        self.devices_seen: set[str] = set()
        self._findings: dict[tuple, Finding] = {}
        self._paused = 0
        self._in_scaler_step = False
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._step_dtypes: set[tuple[str, torch.dtype]] = set()
        self._scaled_this_step = False
        self._undo: list[Callable[[], None]] = []
        self.scaler_checks = ScalerChecks(self)
        self.cast_checks = CastChecks(self)
        self.host_reads = HostReads(self)

    # ------------------------------------------------------------------ results
    @property
    def findings(self) -> list[Finding]:
        return list(self._findings.values())

    def add(self, finding: Finding, key: tuple | None = None) -> None:
        """Keep the first finding per key (default: code and where)."""
        self._findings.setdefault(key or (finding.code, finding.where), finding)

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
                       optim_mod.register_optimizer_step_pre_hook(self._opt_pre_hook)):
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
        self._patch(torch.Tensor, "half", casts.wrap_tensor_half)
        self._patch(torch.Tensor, "to", casts.wrap_tensor_to)
        self._patch(torch.nn.Module, "half", casts.wrap_module_half)
        for name in SYNC_NAMES:
            self._patch(torch.Tensor, name, self.host_reads.wrap(name))

    # ------------------------------------------------------------------ module hooks
    def _pre_hook(self, module, args):
        if self._paused:
            return None
        with self.paused():
            root = self.tracker.enter(module)
            if root and self.mode == "diagnose" and self.locator.before_root(module):
                self._flush()
        return None

    def _fwd_hook(self, module, args, kwargs, output):
        if self._paused:
            return None
        with self.paused():
            self.tracker.leave()
            if self.mode == "diagnose":
                self.locator.record(module, args, kwargs, output, self.user.where(), self.step)
            else:
                self.recorder.record(module, args, kwargs, output)
            dev = _first_device(output)
            if dev is not None:
                self.devices_seen.add(dev)
        return None

    def _flush(self) -> None:
        for f in self.locator.flush(report_backward=not self._scaled_this_step):
            self.add(f, key=(f.code,))

    # ------------------------------------------------------------------ optimizer steps
    def _wrap_opt_init(self, orig):
        inst = self

        def __init__(opt, *args, **kwargs):
            orig(opt, *args, **kwargs)
            inst._optimizers.add(opt)

        return __init__

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
                self.recorder.record_params(optimizer_params(optimizer))
            else:
                self._flush()
                if not self._scaled_this_step and any(d == torch.float16 for _, d in self._step_dtypes):
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
            return
        with self.paused():
            self._flush()
        self.host_reads.finish()
        self.scaler_checks.finish()


def _first_device(output: Any) -> str | None:
    if isinstance(output, torch.Tensor):
        return output.device.type
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0].device.type
    return None
