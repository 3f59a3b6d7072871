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

Device values are read in one batch per optimizer step. The script is stopped after ``steps``
optimizer steps by raising :class:`StopRun` (a ``BaseException``) from the step wrapper.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.fp16range import RangeRecorder
from ampkit.diagnose.nonfinite import NonFiniteLocator
from ampkit.diagnose.tracking import ModuleTracker, UserCode, frame_where

__all__ = ["Instrumentation", "StopRun"]

_COLLAPSE_WINDOW = 20
_COLLAPSE_BACKOFFS = 5
_UNDERFLOW_SHARE = 0.5
_SYNC_NAMES = {"item": "`.item()`", "tolist": "`.tolist()`", "__bool__": "`bool(tensor)` (e.g. `if tensor:`)",
               "__float__": "`float(tensor)`", "__int__": "`int(tensor)`"}


class StopRun(BaseException):
    """Raised inside the script to stop it (step budget reached, or a finding that ends the run).

    A BaseException so that the script's ``except Exception`` blocks do not swallow it.
    """


def _is_accelerator_tensor(t: torch.Tensor) -> bool:
    """A host read of this tensor waits for the device (not on the CPU, where it is a plain read)."""
    return t.device.type not in ("cpu", "meta")


@dataclass
class _ScalerState:
    scaled_pending: bool = False          # scale() called since the last update()
    unscaled: set = field(default_factory=set)  # id(optimizer) unscaled since the last update()
    backoffs: deque = field(default_factory=lambda: deque(maxlen=_COLLAPSE_WINDOW))
    had_success: bool = False
    first_scale: float | None = None
    updates: int = 0


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
        self._scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._step_dtypes: set[tuple[str, torch.dtype]] = set()
        self._scaled_this_step = False
        self._saves_without_scaler: list[tuple[str, int]] = []
        self._scaler_saved = False
        self._syncs: dict[str, tuple[str, set[int]]] = {}
        self._undo: list[Callable[[], None]] = []

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
        gs = torch.amp.GradScaler
        self._patch(gs, "__init__", self._wrap_scaler_init)
        self._patch(gs, "scale", self._wrap_scale)
        self._patch(gs, "unscale_", self._wrap_unscale)
        self._patch(gs, "step", self._wrap_scaler_step)
        self._patch(gs, "update", self._wrap_update)
        import torch.nn.utils.clip_grad as clip_mod

        for owner in (torch.nn.utils, clip_mod):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                self._patch(owner, name, self._wrap_clip)
        for owner in (torch, torch.serialization):
            self._patch(owner, "save", self._wrap_save)
        ac = torch.amp.autocast_mode.autocast
        self._patch(ac, "__init__", self._wrap_autocast_init)
        self._patch(ac, "__enter__", self._wrap_autocast_enter)
        self._patch(torch.Tensor, "half", self._wrap_tensor_half)
        self._patch(torch.Tensor, "to", self._wrap_tensor_to)
        self._patch(torch.nn.Module, "half", self._wrap_module_half)
        for name in _SYNC_NAMES:
            self._patch(torch.Tensor, name, _sync_wrapper(self, name))

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
                self.recorder.record_params(_params(optimizer))
            else:
                self._flush()
                if not self._scaled_this_step and any(d == torch.float16 for _, d in self._step_dtypes):
                    self._check_underflow(optimizer)
            self._step_dtypes.clear()
            self._scaled_this_step = False
            if self.step >= self.max_steps:
                raise StopRun(f"stopped after {self.max_steps} optimizer steps")
            self.step += 1

    def _check_underflow(self, optimizer) -> None:
        params = [p for p in _params(optimizer) if p.grad is not None and p.grad.is_floating_point()]
        if not params:
            return
        with torch.no_grad():
            shares = [((p.grad == 0) | (p.grad.abs() < 2.0 ** -14)).float().mean() for p in params]
            values = torch.stack([s.to(shares[0].device) for s in shares]).cpu().tolist()
        bad = [(self.tracker.param_name(p), v) for p, v in zip(params, values) if v >= _UNDERFLOW_SHARE]
        if not bad:
            return
        worst = ", ".join(f"{n} {v:.0%}" for n, v in sorted(bad, key=lambda x: -x[1])[:4])
        self.add(Finding(
            code="fp16-without-scaler",
            message=f"FP16 autocast without a GradScaler: {len(bad)} of {len(params)} parameters have at least "
                    f"{_UNDERFLOW_SHARE:.0%} of their gradient elements zero or subnormal (below 2^-14) ({worst})",
            where=self.user.where(), fix=fix_for("fp16-without-scaler"), step=self.step), key=("fp16-without-scaler",))

    # ------------------------------------------------------------------ GradScaler
    def _state(self, scaler) -> _ScalerState:
        st = self._scalers.get(scaler)
        if st is None:
            st = self._scalers[scaler] = _ScalerState()
        return st

    def _wrap_scaler_init(self, orig):
        inst = self
        sig = inspect.signature(orig)

        def __init__(scaler, *args, **kwargs):
            if inst.mode == "range" and not inst._paused:
                bound = sig.bind(scaler, *args, **kwargs)
                bound.arguments["enabled"] = False
                args, kwargs = bound.args[1:], bound.kwargs
            orig(scaler, *args, **kwargs)
            inst._state(scaler)

        return __init__

    def _wrap_scale(self, orig):
        inst = self

        def scale(scaler, outputs):
            if not inst._paused and inst.mode == "diagnose" and scaler.is_enabled():
                st = inst._state(scaler)
                st.scaled_pending = True
                inst._scaled_this_step = True
                dtypes = {d for _, d in inst._step_dtypes}
                if dtypes and dtypes <= {torch.bfloat16}:
                    inst.add(Finding(
                        code="scaler-with-bf16",
                        message="an enabled GradScaler scales a loss computed under BF16 autocast: BF16 has FP32's "
                                "exponent range, so the scaling (and its inf checks) is wasted work",
                        where=inst.user.where(), fix=fix_for("scaler-with-bf16"), step=inst.step))
            return orig(scaler, outputs)

        return scale

    def _check_fp16_params(self, scaler, optimizer) -> None:
        names = [self.tracker.param_name(p) for p in _params(optimizer)
                 if p.grad is not None and p.grad.dtype == torch.float16]
        if names:
            self.add(Finding(
                code="fp16-params-with-scaler",
                message=f"{len(names)} parameters are FP16 ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) "
                        "and a GradScaler unscales their gradients: torch refuses with \"Attempting to unscale FP16 "
                        "gradients\"; FP16 weights also lose small updates",
                where=self.user.where(), fix=fix_for("fp16-params-with-scaler"), step=self.step),
                key=("fp16-params-with-scaler",))

    def _wrap_unscale(self, orig):
        inst = self

        def unscale_(scaler, optimizer):
            if not inst._paused and inst.mode == "diagnose" and scaler.is_enabled():
                with inst.paused():
                    inst._check_fp16_params(scaler, optimizer)
                inst._state(scaler).unscaled.add(id(optimizer))
            return orig(scaler, optimizer)

        return unscale_

    def _wrap_scaler_step(self, orig):
        inst = self

        def step(scaler, optimizer, *args, **kwargs):
            if inst._paused or inst._in_scaler_step:
                return orig(scaler, optimizer, *args, **kwargs)
            if inst.mode == "diagnose" and scaler.is_enabled():
                with inst.paused():
                    inst._check_fp16_params(scaler, optimizer)
            inst._begin_step(optimizer)
            inst._in_scaler_step = True
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            finally:
                inst._in_scaler_step = False

        return step

    def _wrap_update(self, orig):
        inst = self

        def update(scaler, new_scale=None):
            if inst._paused or inst.mode != "diagnose" or not scaler.is_enabled():
                return orig(scaler, new_scale)
            with inst.paused():
                before = scaler.get_scale()
            result = orig(scaler, new_scale)
            with inst.paused():
                after = scaler.get_scale()
                st = inst._state(scaler)
                st.first_scale = before if st.first_scale is None else st.first_scale
                st.updates += 1
                st.scaled_pending = False
                st.unscaled.clear()
                backoff = after < before
                if not backoff:
                    st.had_success = True
                if st.had_success:
                    st.backoffs.append(backoff)
                recent = sum(st.backoffs)
                if after < 1.0 or recent > _COLLAPSE_BACKOFFS:
                    why = (f"the scale fell below 1 ({after:g})" if after < 1.0 else
                           f"{recent} backoffs in the last {len(st.backoffs)} updates")
                    inst.add(Finding(
                        code="scale-collapse",
                        message=f"the loss scale fell from {st.first_scale:g} to {after:g} over {st.updates} updates: "
                                f"{why}; gradients overflow FP16 on most steps, which are then skipped",
                        where=inst.user.where(), fix=fix_for("scale-collapse"), step=inst.step),
                        key=("scale-collapse",))
            return result

        return update

    def _enabled_scalers(self) -> list[tuple[Any, _ScalerState]]:
        return [(s, st) for s, st in list(self._scalers.items()) if s.is_enabled()]

    # ------------------------------------------------------------------ clipping, checkpoints
    def _wrap_clip(self, orig):
        inst = self

        def clip(parameters, *args, **kwargs):
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            else:
                parameters = list(parameters)
            if not inst._paused and inst.mode == "diagnose":
                inst._check_clip(parameters)
            return orig(parameters, *args, **kwargs)

        clip.__wrapped__ = orig
        return clip

    def _check_clip(self, parameters: list) -> None:
        ids = {id(p) for p in parameters}
        owners = [o for o in list(self._optimizers) if any(id(p) in ids for p in _params(o))]
        for _, st in self._enabled_scalers():
            if not st.scaled_pending:
                continue
            if not owners or any(id(o) not in st.unscaled for o in owners):
                self.add(Finding(
                    code="clip-before-unscale",
                    message="gradients are clipped while still multiplied by the loss scale (the GradScaler scaled "
                            "the loss and `scaler.unscale_(optimizer)` was not called before clipping): the clip "
                            "threshold acts on scaled values, so it clips far too much or changes with the scale",
                    where=self.user.where(2), fix=fix_for("clip-before-unscale"), step=self.step))
                return

    def _wrap_save(self, orig):
        inst = self

        def save(obj, f, *args, **kwargs):
            if not inst._paused and inst.mode == "diagnose":
                with inst.paused():
                    has_scaler = _contains_scaler_state(obj)
                    inst._scaler_saved |= has_scaler
                    if not has_scaler and _contains_training_state(obj) and inst._enabled_scalers():
                        inst._saves_without_scaler.append((inst.user.where(), inst.step))
            return orig(obj, f, *args, **kwargs)

        return save

    # ------------------------------------------------------------------ autocast and casts
    def _wrap_autocast_init(self, orig):
        inst = self
        sig = inspect.signature(orig)

        def __init__(ac, *args, **kwargs):
            if not inst._paused:
                bound = sig.bind(ac, *args, **kwargs)
                bound.apply_defaults()
                if inst.mode == "range":
                    bound.arguments["enabled"] = False
                elif bound.arguments["enabled"]:
                    inst._check_dtype(bound.arguments["device_type"], bound.arguments["dtype"])
                args, kwargs = bound.args[1:], bound.kwargs
            orig(ac, *args, **kwargs)

        return __init__

    def _check_dtype(self, device_type: Any, dtype: torch.dtype | None) -> None:
        if not isinstance(device_type, str) or device_type in ("cpu", "mps", "xpu", "meta"):
            return
        from ampkit.device import Device
        from ampkit.hardware import card_facts

        with self.paused():
            if dtype is None:
                try:
                    dtype = torch.get_autocast_dtype(device_type)
                except Exception:  # noqa: BLE001 - an unknown backend: nothing to compare
                    return
            key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
            if key is None:
                return
            dev = Device(device_type, 0)
            facts = card_facts(dev)
            if getattr(facts, key) is not False:
                return
            other = "fp16" if key == "bf16" else "bf16"
            ok_other = getattr(facts, other)
            name = dev.name
        self.add(Finding(
            code="dtype-unsupported",
            message=f"autocast to {key.upper()} on {name} ({facts.family}): the card table says this card cannot run "
                    f"{key.upper()}" + (" (a tensor of that dtype can still be created, so "
                                        "`is_bf16_supported()` may say True)" if key == "bf16" else ""),
            where=self.user.where(2),
            fix=(f"use `dtype=torch.{'float16' if other == 'fp16' else 'bfloat16'}`"
                 + (" with a GradScaler" if other == "fp16" else "") + "; `ampkit doctor` lists what this card runs"
                 if ok_other else fix_for("dtype-unsupported")),
            step=self.step))
        raise StopRun(f"autocast to {key.upper()} is not supported on {name}")

    def _wrap_autocast_enter(self, orig):
        inst = self

        def __enter__(ac):
            if not inst._paused and getattr(ac, "_enabled", False):
                inst._step_dtypes.add((ac.device, ac.fast_dtype))
            return orig(ac)

        return __enter__

    def _half_in_autocast(self, t: Any, what: str) -> None:
        frame = self.user.caller_is_user(2)
        if frame is None:
            return
        dev = t.device.type if isinstance(t, torch.Tensor) else next((p.device.type for p in t.parameters()), "cpu")
        if not torch.is_autocast_enabled(dev):
            return
        self.add(Finding(
            code="half-inside-autocast",
            message=f"{what} inside an autocast region: autocast already runs matmuls and convolutions in low "
                    "precision; a manual cast also forces FP16 on ops autocast keeps in FP32 (softmax, norms, losses) "
                    "and, on a parameter or a model, gives FP16 weights",
            where=frame_where(frame), fix=fix_for("half-inside-autocast"), step=self.step))

    def _wrap_tensor_half(self, orig):
        inst = self

        def half(t, *args, **kwargs):
            if not inst._paused and inst.mode == "diagnose" and t.is_floating_point():
                inst._half_in_autocast(t, "`.half()`")
            return orig(t, *args, **kwargs)

        return half

    def _wrap_tensor_to(self, orig):
        inst = self

        def to(t, *args, **kwargs):
            if (not inst._paused and inst.mode == "diagnose"
                    and (kwargs.get("dtype") is torch.float16 or any(a is torch.float16 for a in args))
                    and t.is_floating_point()):
                inst._half_in_autocast(t, "`.to(torch.float16)`")
            return orig(t, *args, **kwargs)

        return to

    def _wrap_module_half(self, orig):
        inst = self

        def half(module):
            if not inst._paused and inst.mode == "diagnose":
                with inst.paused():
                    inst._half_in_autocast(module, "`module.half()`")
            return orig(module)

        return half

    # ------------------------------------------------------------------ host syncs
    def note_sync(self, t: torch.Tensor, name: str) -> None:
        frame = self.user.caller_is_user(2)
        if frame is None or not _is_accelerator_tensor(t):
            return
        where = frame_where(frame)
        entry = self._syncs.setdefault(where, (name, set()))
        entry[1].add(self.step)

    # ------------------------------------------------------------------ end of run
    def finish(self) -> None:
        """Flush what is pending and turn run-level observations into findings."""
        if self.mode != "diagnose":
            return
        with self.paused():
            self._flush()
        steps_seen = self.step + 1
        needed = max(2, math.ceil(0.8 * steps_seen))
        for where, (name, steps) in self._syncs.items():
            if self.step >= 1 and len(steps) >= needed:
                self.add(Finding(
                    code="host-sync-per-step",
                    message=f"{_SYNC_NAMES[name]} reads a device value on the host in {len(steps)} of {steps_seen} "
                            "steps: each one waits for the device to finish all queued work",
                    where=where, fix=fix_for("host-sync-per-step"), step=min(steps)))
        if self._saves_without_scaler and not self._scaler_saved:
            where, step = self._saves_without_scaler[0]
            self.add(Finding(
                code="scaler-not-checkpointed",
                message="`torch.save` writes model/optimizer state while an enabled GradScaler exists, and no save "
                        "in this run included `scaler.state_dict()`: a resumed run restarts the scale at its "
                        "initial value (extra skipped steps, different numbers than never stopping)",
                where=where, fix=fix_for("scaler-not-checkpointed"), step=step))


def _sync_wrapper(inst: Instrumentation, name: str):
    def make(orig):
        def read(t, *args, **kwargs):
            if not inst._paused and inst.mode == "diagnose":
                inst.note_sync(t, name)
            return orig(t, *args, **kwargs)

        read.__name__ = name
        return read

    return make


def _params(optimizer) -> list[torch.Tensor]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def _first_device(output: Any) -> str | None:
    if isinstance(output, torch.Tensor):
        return output.device.type
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0].device.type
    return None


_SCALER_KEYS = {"scale", "growth_factor", "backoff_factor", "growth_interval"}


def _walk(obj: Any, depth: int = 0):
    yield obj
    if depth > 4:
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v, depth + 1)


def _contains_scaler_state(obj: Any) -> bool:
    for item in _walk(obj):
        if isinstance(item, torch.amp.GradScaler):
            return True
        if isinstance(item, dict) and _SCALER_KEYS <= set(item.keys()):
            return True
    return False


def _contains_training_state(obj: Any) -> bool:
    for item in _walk(obj):
        if isinstance(item, (torch.nn.Module, torch.optim.Optimizer)):
            return True
        if isinstance(item, dict) and item:
            keys = set(item.keys())
            if {"state", "param_groups"} <= keys:
                return True
            if all(isinstance(k, str) for k in keys) and all(isinstance(v, torch.Tensor) for v in item.values()):
                return True
    return False
