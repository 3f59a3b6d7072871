"""GradScaler, gradient clipping and checkpoint checks of a diagnose run.

:class:`ScalerChecks` holds the per-scaler bookkeeping of one run and the wrappers that
:class:`~ampkit.diagnose.instrument.Instrumentation` installs around ``torch.amp.GradScaler``
(``__init__``, ``scale``, ``unscale_``, ``step``, ``update``), ``clip_grad_norm_`` /
``clip_grad_value_`` and ``torch.save``. They find ``scaler-with-bf16``, ``fp16-params-with-scaler``,
``scale-collapse``, ``clip-before-unscale`` and, at the end of the run, ``scaler-not-checkpointed``;
at each optimizer step :meth:`ScalerChecks.check_underflow` finds ``fp16-without-scaler``. In range
mode the scaler is forced off.
"""

from __future__ import annotations

import inspect
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.fixes import clip_fix, half_cast_fix
from ampkit.diagnose.source import keyword_source
from ampkit.diagnose.tracking import short_path

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["ScalerChecks", "optimizer_params"]

_COLLAPSE_WINDOW = 20
_COLLAPSE_BACKOFFS = 5
_UNDERFLOW_SHARE = 0.5


def optimizer_params(optimizer) -> list[torch.Tensor]:
    """Every parameter of ``optimizer``, over its param groups."""
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


@dataclass
class _ScalerState:
    scaled_pending: bool = False          # scale() called since the last update()
    unscaled: set = field(default_factory=set)  # id(optimizer) unscaled since the last update()
    backoffs: deque = field(default_factory=lambda: deque(maxlen=_COLLAPSE_WINDOW))
    had_success: bool = False
    first_scale: float | None = None
    updates: int = 0
    stepped: bool = False                 # step() called since the last update()
    scaled_after_step: bool = False       # ... and scale() again after it: a new iteration without update()
    created_at: tuple[str, int] | None = None  # the user's (file, line) that created the scaler


class ScalerChecks:
    """The GradScaler, clipping and checkpoint findings of one run; ``inst`` is the run's
    :class:`~ampkit.diagnose.instrument.Instrumentation` (pause state, mode, step, findings)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._saves_without_scaler: list[tuple[str, int]] = []
        self._scaler_saved = False

    # ------------------------------------------------------------------ optimizer steps
    def check_underflow(self, optimizer) -> None:
        """``fp16-without-scaler``: at a step taken under FP16 autocast without an enabled scaler."""
        inst = self.inst
        params = [p for p in optimizer_params(optimizer) if p.grad is not None and p.grad.is_floating_point()]
        if not params:
            return
        with torch.no_grad():
            shares = [((p.grad == 0) | (p.grad.abs() < 2.0 ** -14)).float().mean() for p in params]
            values = torch.stack([s.to(shares[0].device) for s in shares]).cpu().tolist()
        bad = [(inst.tracker.param_name(p), v) for p, v in zip(params, values) if v >= _UNDERFLOW_SHARE]
        if not bad:
            return
        worst = ", ".join(f"{n} {v:.0%}" for n, v in sorted(bad, key=lambda x: -x[1])[:4])
        disabled = self._disabled_scaler()
        inst.add(Finding(
            code="fp16-without-scaler",
            message=f"FP16 autocast without a GradScaler: {len(bad)} of {len(params)} parameters have at least "
                    f"{_UNDERFLOW_SHARE:.0%} of their gradient elements zero or subnormal (below 2^-14) ({worst})",
            where=disabled[0] if disabled else inst.user.where(),
            fix=disabled[1] if disabled else fix_for("fp16-without-scaler"), step=inst.step), key=("fp16-without-scaler",))

    def _disabled_scaler(self) -> tuple[str, str] | None:
        """``(where, fix)`` for FP16 without loss scaling when the script does create a GradScaler, but a disabled
        one: its line, and a fix that names what disabled it (its ``enabled=`` expression, or its device)."""
        for scaler, st in list(self._scalers.items()):
            if scaler.is_enabled() or st.created_at is None:
                continue
            filename, line = st.created_at
            where = f"{short_path(filename)}:{line}"
            expr = keyword_source(filename, line, "GradScaler", "enabled", position=1)
            device = getattr(scaler, "_device", None)
            if expr is not None and expr not in ("True", "1"):
                why = f"is created with `enabled={expr}`, which is False for FP16"
            elif isinstance(device, str) and device not in {d for d, _ in self.inst.step_dtypes_seen}:
                why = f"is created for device '{device}', which this run does not use (a scaler disables itself there)"
            else:
                why = "is disabled"
            return where, (f"your GradScaler at {where} {why}: enable it whenever the autocast dtype is FP16, e.g. "
                           "`torch.amp.GradScaler(device_type, enabled=(dtype == torch.float16))`, and keep "
                           "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`; or use "
                           "BF16 where the card has it (`ampkit doctor`)")
        return None

    # ------------------------------------------------------------------ GradScaler
    def _state(self, scaler) -> _ScalerState:
        st = self._scalers.get(scaler)
        if st is None:
            st = self._scalers[scaler] = _ScalerState()
        return st

    def wrap_scaler_init(self, orig):
        inst, checks = self.inst, self
        sig = inspect.signature(orig)

        def __init__(scaler, *args, **kwargs):
            if inst.mode == "range" and not inst._paused:
                bound = sig.bind(scaler, *args, **kwargs)
                bound.arguments["enabled"] = False
                args, kwargs = bound.args[1:], bound.kwargs
            orig(scaler, *args, **kwargs)
            st = checks._state(scaler)
            if not inst._paused:
                f = inst.user.frame(1)
                st.created_at = (f.f_code.co_filename, f.f_lineno) if f is not None else None

        return __init__

    def wrap_scale(self, orig):
        inst, checks = self.inst, self

        def scale(scaler, outputs):
            if not inst._paused and inst.mode == "diagnose" and scaler.is_enabled():
                with inst.paused():
                    inst.loop_checks.note_scaled_loss(outputs)
                st = checks._state(scaler)
                st.scaled_after_step |= st.stepped
                st.scaled_pending = True
                inst._scaled_this_step = True
                dtypes = {d for _, d in inst._step_dtypes}
                if dtypes and dtypes <= {torch.bfloat16}:
                    inst.add(Finding(
                        code="scaler-with-bf16",
                        message="an enabled GradScaler scales a loss computed under BF16 autocast: BF16 has FP32's "
                                "exponent range, so the scaling (and its inf checks) is wasted work",
                        where=inst.user.where(), fix=fix_for("scaler-with-bf16"), step=inst.step))
            result = orig(scaler, outputs)
            if not inst._paused and inst.mode == "diagnose" and scaler.is_enabled():
                inst.loop_checks.note_scale_output(result)
            return result

        return scale

    def _check_fp16_params(self, scaler, optimizer) -> None:
        inst = self.inst
        half = [p for p in optimizer_params(optimizer) if p.grad is not None and p.grad.dtype == torch.float16]
        if not half:
            return
        names = [inst.tracker.param_name(p) for p in half]
        cast = inst.loop_checks.half_line(half)
        inst.add(Finding(
            code="fp16-params-with-scaler",
            message=f"{len(names)} parameters are FP16 ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) "
                    "and a GradScaler unscales their gradients: torch refuses with \"Attempting to unscale FP16 "
                    "gradients\"; FP16 weights also lose small updates"
                    + (f" (the GradScaler steps at {inst.user.where()}; the weights were made FP16 at {cast})" if cast else ""),
            where=cast or inst.user.where(),
            fix=half_cast_fix(cast, inst.source_line(cast)) if cast else fix_for("fp16-params-with-scaler"),
            step=inst.step), key=("fp16-params-with-scaler",))

    def wrap_unscale(self, orig):
        inst, checks = self.inst, self

        def unscale_(scaler, optimizer):
            if not inst._paused and inst.mode == "diagnose" and scaler.is_enabled():
                inst.clip_watch.check()
                with inst.paused():
                    checks._check_fp16_params(scaler, optimizer)
                checks._state(scaler).unscaled.add(id(optimizer))
            return orig(scaler, optimizer)

        return unscale_

    def wrap_scaler_step(self, orig):
        inst, checks = self.inst, self

        def step(scaler, optimizer, *args, **kwargs):
            if inst._paused or inst._in_scaler_step:
                return orig(scaler, optimizer, *args, **kwargs)
            if inst.mode == "diagnose" and scaler.is_enabled():
                inst.clip_watch.check()
                with inst.paused():
                    checks._check_fp16_params(scaler, optimizer)
                    inst.loop_checks.note_scaler_step(scaler, optimizer)
                checks._state(scaler).stepped = True
            inst._begin_step(optimizer)
            inst._in_scaler_step = True
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            finally:
                inst._in_scaler_step = False

        return step

    def wrap_update(self, orig):
        inst, checks = self.inst, self

        def update(scaler, new_scale=None):
            if inst._paused or inst.mode != "diagnose" or not scaler.is_enabled():
                return orig(scaler, new_scale)
            with inst.paused():
                inst.loop_checks.note_update(scaler)
                before = scaler.get_scale()
            result = orig(scaler, new_scale)
            with inst.paused():
                after = scaler.get_scale()
                st = checks._state(scaler)
                st.first_scale = before if st.first_scale is None else st.first_scale
                st.updates += 1
                st.scaled_pending = st.stepped = st.scaled_after_step = False
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

    def settled_scale(self) -> float | None:
        """The scale of an enabled GradScaler that has updated at least once (None: no such scaler)."""
        for scaler, st in self._enabled_scalers():
            if st.updates:
                with self.inst.paused():
                    return float(scaler.get_scale())
        return None

    def pending_scale(self) -> float:
        """The factor the current gradients carry: an enabled scaler's scale when it scaled this step's
        loss and has not unscaled yet, else 1."""
        for scaler, st in self._enabled_scalers():
            if st.scaled_pending and not st.unscaled:
                with self.inst.paused():
                    return float(scaler.get_scale())
        return 1.0

    def update_missing(self) -> bool:
        """An enabled scaler stepped, then scaled a new loss, with no ``update()`` in between."""
        return any(st.scaled_after_step for _, st in self._enabled_scalers())

    def loss_scale(self) -> float | None:
        """The scale of the enabled scaler that scaled this step's loss (unscaled or not), None if none."""
        for scaler, st in self._enabled_scalers():
            if st.scaled_pending:
                with self.inst.paused():
                    return float(scaler.get_scale())
        return None

    def _enabled_scalers(self) -> list[tuple[Any, _ScalerState]]:
        return [(s, st) for s, st in list(self._scalers.items()) if s.is_enabled()]

    # ------------------------------------------------------------------ clipping, checkpoints
    def wrap_clip(self, orig):
        inst, checks = self.inst, self

        def clip(parameters, *args, **kwargs):
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            else:
                parameters = list(parameters)
            if not inst._paused and inst.mode == "diagnose":
                checks._check_clip(parameters, orig.__name__)
            return orig(parameters, *args, **kwargs)

        clip.__wrapped__ = orig
        return clip

    def _check_clip(self, parameters: list, function: str) -> None:
        inst = self.inst
        ids = {id(p) for p in parameters}
        owners = [o for o in list(inst._optimizers) if any(id(p) in ids for p in optimizer_params(o))]
        for _, st in self._enabled_scalers():
            if not st.scaled_pending:
                continue
            if not owners or any(id(o) not in st.unscaled for o in owners):
                inst.add(Finding(
                    code="clip-before-unscale",
                    message=f"`{function}` clips gradients still multiplied by the loss scale (the GradScaler "
                            "scaled the loss and `scaler.unscale_(optimizer)` was not called before clipping): the "
                            "clip threshold acts on scaled values, so it clips far too much or changes with the scale",
                    where=inst.user.where(2), fix=clip_fix(function), step=inst.step))
                return

    def wrap_save(self, orig):
        inst, checks = self.inst, self

        def save(obj, f, *args, **kwargs):
            if not inst._paused and inst.mode == "diagnose":
                with inst.paused():
                    has_scaler = _contains_scaler_state(obj)
                    checks._scaler_saved |= has_scaler
                    if not has_scaler and _contains_training_state(obj) and checks._enabled_scalers():
                        checks._saves_without_scaler.append((inst.user.where(), inst.step))
            return orig(obj, f, *args, **kwargs)

        return save

    # ------------------------------------------------------------------ end of run
    def finish(self) -> None:
        """``scaler-not-checkpointed``: a save of training state, and no save of the scaler's, in the run."""
        if self._saves_without_scaler and not self._scaler_saved:
            where, step = self._saves_without_scaler[0]
            self.inst.add(Finding(
                code="scaler-not-checkpointed",
                message="`torch.save` writes model/optimizer state while an enabled GradScaler exists, and no save "
                        "in this run included `scaler.state_dict()`: a resumed run restarts the scale at its "
                        "initial value (extra skipped steps, different numbers than never stopping)",
                where=where, fix=fix_for("scaler-not-checkpointed"), step=step))


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
