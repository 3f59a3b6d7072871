"""Autocast and manual casts in a diagnose run: the precision the script asks for.

:class:`CastChecks` holds the wrappers that :class:`~ampkit.diagnose.instrument.Instrumentation`
installs around ``torch.autocast`` and ``Tensor.half`` / ``Tensor.to`` / ``Module.half``:

* autocast construction: forced off in range mode, else checked against the precision decision
  (``dtype-unsupported``, by :func:`ampkit.device.policy.resolve_precision`; it ends the run);
* autocast entry: records the autocast (device, dtype) of the current optimizer step, which the
  step and GradScaler checks read;
* manual casts to FP16 made directly by the user's code inside an autocast region
  (``half-inside-autocast``).
"""

from __future__ import annotations

import inspect
import linecache
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.stop import StopRun
from ampkit.diagnose.tracking import frame_where

if TYPE_CHECKING:
    from ampkit.diagnose.instrument import Instrumentation

__all__ = ["CastChecks"]


class CastChecks:
    """The autocast and manual-cast wrappers of one run; ``inst`` is the run's
    :class:`~ampkit.diagnose.instrument.Instrumentation` (pause state, mode, step, findings)."""

    def __init__(self, inst: Instrumentation) -> None:
        self.inst = inst
        self._decided: dict[tuple[str, str], str | None] = {}
        self._fp32: dict[int, weakref.ref] = {}  # tensors the script cast to FP32 (range mode)
        self._fp16_made: dict[int, str] = {}  # storage address of an FP16 tensor the script's own line cast -> that line

    # ------------------------------------------------------------------ autocast
    def wrap_autocast_init(self, orig):
        inst, checks = self.inst, self
        sig = inspect.signature(orig)

        def __init__(ac, *args, **kwargs):
            if not is_compiling() and not inst._paused:
                bound = sig.bind(ac, *args, **kwargs)
                bound.apply_defaults()
                if inst.mode == "range":
                    user_enabled = bool(bound.arguments["enabled"])
                    bound.arguments["enabled"] = False
                elif bound.arguments["enabled"]:
                    checks._check_dtype(bound.arguments["device_type"], bound.arguments["dtype"])
                args, kwargs = bound.args[1:], bound.kwargs
            orig(ac, *args, **kwargs)
            if not is_compiling() and not inst._paused and inst.mode == "range":
                ac._ampkit_user_enabled = user_enabled  # the range run follows the script's own regions

        return __init__

    def _check_dtype(self, device_type: Any, dtype: torch.dtype | None) -> None:
        if not isinstance(device_type, str) or device_type in ("cpu", "mps", "xpu", "meta"):
            return
        inst = self.inst
        with inst.paused():
            if dtype is None:
                try:
                    dtype = torch.get_autocast_dtype(device_type)
                except RuntimeError:  # an unknown backend: nothing to compare
                    return
            key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
            if key is None:
                return
            refusal = self._refusal(device_type, key)
            if refusal is None:
                return
            other = "fp16" if key == "bf16" else "bf16"
            ok_other = self._refusal(device_type, other) is None
        inst.add(Finding(
            code="dtype-unsupported",
            message=f"autocast to {key.upper()}: {refusal}" + (" (a tensor of that dtype can still be created, so "
                                                                "`is_bf16_supported()` may say True)" if key == "bf16" else ""),
            where=inst.user.where(2),
            fix=(f"use `dtype=torch.{'float16' if other == 'fp16' else 'bfloat16'}`"
                 + (" with a GradScaler" if other == "fp16" else "") + "; `ampkit doctor` lists what this card runs"
                 if ok_other else fix_for("dtype-unsupported")),
            step=inst.step))
        raise StopRun(f"autocast to {key.upper()} is not supported on this {device_type} device")

    def _refusal(self, device_type: str, key: str) -> str | None:
        """Why ``key`` cannot run on ``device_type`` (None: it can), by the one precision decision,
        :func:`ampkit.device.policy.resolve_precision` (card table, then the run-time probe); asked once per run."""
        from ampkit.device import Device
        from ampkit.errors import PrecisionUnsupported
        from ampkit.device.policy import resolve_precision

        if (device_type, key) not in self._decided:
            try:
                resolve_precision(key, Device(device_type, 0))
                self._decided[(device_type, key)] = None
            except PrecisionUnsupported as exc:
                self._decided[(device_type, key)] = str(exc)
        return self._decided[(device_type, key)]

    def wrap_autocast_enter(self, orig):
        inst = self.inst

        def __enter__(ac):
            if not is_compiling() and not inst._paused and getattr(ac, "_enabled", False):
                inst._step_dtypes.add((ac.device, ac.fast_dtype))
                inst.step_dtypes_seen.add((ac.device, ac.fast_dtype))
            regions = self._regions(ac)
            if regions is not None:
                regions.append(ac._ampkit_user_enabled)
            return orig(ac)

        return __enter__

    def _regions(self, ac) -> list | None:
        """Range mode: the stack of the script's autocast regions (on/off as the script asked) the FP32 run follows."""
        watch = self.inst.watch
        if self.inst.mode != "range" or watch is None or watch.amp is None or not hasattr(ac, "_ampkit_user_enabled"):
            return None
        return watch.amp.enabled

    def wrap_autocast_exit(self, orig):
        def __exit__(ac, *exc):
            regions = self._regions(ac)
            if regions:
                regions.pop()
            return orig(ac, *exc)

        return __exit__

    # ------------------------------------------------------------------ losses
    def wrap_bce(self, orig):
        """``bce-under-autocast``: ``F.binary_cross_entropy`` (also what ``nn.BCELoss`` calls) under an
        enabled autocast. CUDA and MUSA autocast refuse it (the runner maps that error); CPU autocast runs
        it in FP32, so the script works here and fails on the accelerator: found at the call."""
        inst = self.inst

        def binary_cross_entropy(input, *args, **kwargs):
            if not is_compiling() and not inst._paused and inst.mode == "diagnose" and isinstance(input, torch.Tensor):
                dev = input.device.type
                if torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev):
                    with inst.paused():
                        f = inst.user.frame(1)
                    inst.add(Finding(
                        code="bce-under-autocast",
                        message=f"`binary_cross_entropy` (or `nn.BCELoss`) on {str(input.dtype).replace('torch.', '')} "
                                f"probabilities under {dev} autocast: CUDA and MUSA autocast refuse it as unsafe (a "
                                "sigmoid in low precision saturates to exactly 0 or 1, and the log then gives inf); "
                                "CPU autocast runs it in FP32, so the script only fails on the accelerator",
                        where=frame_where(f) if f is not None else "(not in the script's code)",
                        fix=fix_for("bce-under-autocast"), step=inst.step), key=("bce-under-autocast",))
            return orig(input, *args, **kwargs)

        return binary_cross_entropy

    # ------------------------------------------------------------------ manual casts
    def _half_in_autocast(self, t: Any, what: str, follows_dtype_ok: bool = False) -> None:
        inst = self.inst
        frame = inst.user.caller_is_user(2)
        if frame is None:
            return
        if follows_dtype_ok and ".dtype" in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
            return  # `mask.to(scores.dtype)`: follows the dtype autocast gave another tensor, not a cast to FP16
        dev = t.device.type if isinstance(t, torch.Tensor) else next((p.device.type for p in t.parameters()), "cpu")
        if not torch.is_autocast_enabled(dev):
            return
        inst.add(Finding(
            code="half-inside-autocast",
            message=f"{what} inside an autocast region: autocast already runs matmuls and convolutions in low "
                    "precision; a manual cast also forces FP16 on ops autocast keeps in FP32 (softmax, norms, losses) "
                    "and, on a parameter or a model, gives FP16 weights",
            where=frame_where(frame), fix=fix_for("half-inside-autocast"), step=inst.step))

    def wrap_tensor_half(self, orig):
        inst, checks = self.inst, self

        def half(t, *args, **kwargs):
            if not is_compiling() and not inst._paused and inst.mode == "diagnose" and t.is_floating_point():
                checks._half_in_autocast(t, "`.half()`")
            out = orig(t, *args, **kwargs)
            checks._note_fp16(out)
            return out

        return half

    def wrap_tensor_to(self, orig):
        inst, checks = self.inst, self

        def to(t, *args, **kwargs):
            if (not is_compiling() and not inst._paused and inst.mode == "diagnose"
                    and (kwargs.get("dtype") is torch.float16 or any(a is torch.float16 for a in args))
                    and t.is_floating_point()):
                checks._half_in_autocast(t, "`.to(torch.float16)`", follows_dtype_ok=True)
            out = orig(t, *args, **kwargs)
            checks._note_fp16(out)
            if inst.mode == "range" and (kwargs.get("dtype") is torch.float32 or any(a is torch.float32 for a in args)):
                out = checks._range_cast(t, out, torch.float32)
                checks._note_fp32(out)
            return out

        return to

    def _note_fp16(self, out: Any) -> None:
        """An FP16 tensor made by a cast on the user's own line (``w.data = w.data.half()`` in a helper): a
        parameter that later holds this storage was made FP16 there."""
        inst = self.inst
        if (is_compiling() or inst._paused or inst.mode != "diagnose" or not isinstance(out, torch.Tensor)
                or out.dtype != torch.float16 or out.device.type == "meta" or torch.is_autocast_enabled(out.device.type)):
            return
        frame = inst.user.caller_is_user(2)
        if frame is not None and len(self._fp16_made) < 4096:
            self._fp16_made[out.untyped_storage().data_ptr()] = frame_where(frame)

    def fp16_cast_line(self, params: list[torch.Tensor]) -> str | None:
        """The user's line that cast one of ``params`` (FP16 now) to FP16 by hand, if the run saw it."""
        for p in params:
            where = self._fp16_made.get(p.untyped_storage().data_ptr())
            if where is not None:
                return where
        return None

    # ------------------------------------------------------------------ explicit FP32 (range mode)
    # The FP32 run of --fp16-range cannot see which values the AMP run computes in FP32: a loss on
    # `logits.float()` is FP32 there. The casts are noted so that the range report leaves such calls out.
    def wrap_tensor_float(self, orig):
        inst, checks = self.inst, self

        def float_(t, *args, **kwargs):
            out = orig(t, *args, **kwargs)
            if inst.mode == "range" and not is_compiling():
                out = checks._range_cast(t, out, torch.float32)
                checks._note_fp32(out)
            return out

        return float_

    def wrap_tensor_type_as(self, orig):
        inst, checks = self.inst, self

        def type_as(t, other, *args, **kwargs):
            out = orig(t, other, *args, **kwargs)
            if inst.mode == "range" and not is_compiling() and isinstance(other, torch.Tensor):
                watch = inst.watch
                out = checks._range_cast(t, out, watch.amp.of(other) if watch is not None and watch.amp else other.dtype)
            return out

        return type_as

    def _range_cast(self, t: Any, out: Any, dtype: torch.dtype) -> Any:
        """Range mode: a cast the FP32 run does not see (``y.float()`` of an FP32 tensor returns ``y``) still gives
        a value of ``dtype`` in the AMP run. The result becomes an alias of ``t`` (so ``t`` keeps its own AMP dtype)
        with that dtype noted."""
        watch = self.inst.watch
        if watch is None or watch.amp is None or not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        if out is t:
            out = t.view_as(t)
        watch.amp.mark(out, dtype)
        return out

    def _note_fp32(self, t: Any) -> None:
        if isinstance(t, torch.Tensor):
            if len(self._fp32) > 256:
                self._fp32 = {k: r for k, r in self._fp32.items() if r() is not None}
            self._fp32[id(t)] = weakref.ref(t)

    def runs_in_fp32(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
        """A parameter-free module (a loss) called on a tensor the script cast with ``.float()``: FP32 in
        the AMP run too."""
        if next(module.parameters(), None) is not None:
            return False
        ins = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
        return any((r := self._fp32.get(id(t))) is not None and r() is t for t in ins)

    def wrap_module_low(self, orig):
        """``Module.bfloat16()`` / ``Module.to(torch.bfloat16 or torch.float16)``: the line that made a model's
        weights low precision, for the findings about weights without a master copy."""
        inst = self.inst

        def cast(module, *args, **kwargs):
            if not is_compiling() and not inst._paused and inst.mode == "diagnose":
                dtypes = [a for a in (*args, kwargs.get("dtype")) if isinstance(a, torch.dtype)]
                if orig.__name__ == "bfloat16" or any(d in (torch.bfloat16, torch.float16) for d in dtypes):
                    with inst.paused():
                        inst.loop_checks.note_half(module)
            return orig(module, *args, **kwargs)

        return cast

    def wrap_module_half(self, orig):
        inst, checks = self.inst, self

        def half(module):
            if not is_compiling() and not inst._paused and inst.mode == "diagnose":
                with inst.paused():
                    checks._half_in_autocast(module, "`module.half()`")
                    inst.loop_checks.note_half(module)
            return orig(module)

        return half
