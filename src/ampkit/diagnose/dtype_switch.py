"""Pure low-precision scripts: the FP32 reference keeps the weights FP32 (part of the diagnose runner's switch).

A script that trains in BF16/FP16 without autocast converts its model (``model.to(torch.bfloat16)``,
``.half()``, ``.bfloat16()``, Fabric ``"bf16-true"``/``"16-true"``, ``from_pretrained(dtype=...)``,
``torch.set_default_dtype``) and casts its inputs to match. In the **FP32 runs** of ``compare SCRIPT``
:class:`DtypeSwitch` makes those conversions no-ops:

* ``Module.half`` / ``Module.bfloat16`` / ``Module.to(low dtype)`` leave the dtype (a device move in the same
  call still happens);
* ``torch.set_default_dtype(low)`` is ignored (parameters created under it stay FP32);
* Hugging Face ``from_pretrained(..., dtype=/torch_dtype=low or "auto")`` loads FP32;
* inputs follow the weights: ``Tensor.to(low)`` / ``.half()`` / ``.bfloat16()`` of a floating tensor leave its
  dtype, and a module whose parameters are FP32 gets its low-precision floating inputs cast to FP32 (a forward
  pre-hook; covers inputs created in low precision by a factory);
* at a module's forward or the first optimizer step, a parameter that is still low precision (created so
  directly, e.g.
  ``nn.Linear(..., dtype=torch.bfloat16)`` or loaded from a low-precision file) ends the run with a
  :class:`~ampkit.diagnose.switch.Refusal` that names it: then no FP32 reference can be made by switching.

Every no-op is recorded (what, where in the script, how often) for the report. In the **AMP runs** nothing
changes; the dtypes the script converts its model to are recorded (its AMP precision when it has no autocast).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch

__all__ = ["DtypeSwitch", "LOW"]

LOW = (torch.float16, torch.bfloat16)
_HF = "transformers.modeling_utils"
_METHOD_DTYPE = {"bfloat16": torch.bfloat16, "half": torch.float16}
_OWN = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dname(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _parse_to(*args: Any, **kwargs: Any) -> tuple[Any, Any, bool, Any]:
    kwargs = {k: v for k, v in kwargs.items() if k != "copy"}  # Tensor.to's own keyword, not _parse_to's
    try:
        return torch._C._nn._parse_to(*args, **kwargs)
    except (TypeError, RuntimeError):
        return None, None, False, None


class DtypeSwitch:
    """The dtype patches of one run: ``mode`` ``"fp32"`` (conversions to low precision become no-ops) or
    ``"amp"`` (recorded only); ``user_dir``: the script's folder (where a no-op is reported)."""

    def __init__(self, mode: str, user_dir: str | None = None, refusal: type[BaseException] = RuntimeError) -> None:
        self.mode, self.user_dir, self.refusal = mode, user_dir, refusal
        self.switched: dict[str, int] = {}  # "what at file:line" -> how many times
        self.low_weights: set[str] = set()  # "device:dtype" the script converted a model to (AMP runs)
        self._inputs_cast = 0

    def install(self, patch: Callable[[Any, str, Callable[[Callable], Callable]], None],
                undo: list[Callable[[], None]]) -> None:
        """Install through the switch's ``patch(owner, name, make)``; removals go on ``undo``."""
        for name in ("half", "bfloat16", "to"):
            patch(torch.nn.Module, name, self._module_cast(name))
        patch(torch, "set_default_dtype", self._default_dtype)
        if self.mode != "fp32":
            return
        for name in ("half", "bfloat16", "to"):
            patch(torch.Tensor, name, self._tensor_cast(name))
        handle = torch.nn.modules.module.register_module_forward_pre_hook(self._inputs_follow_weights)
        undo.append(handle.remove)
        if _HF in sys.modules:
            self.patch_hf(sys.modules[_HF], patch)

    # ------------------------------------------------------------------ where and what
    def _where(self) -> str:
        frame = sys._getframe(2)
        fallback = None
        while frame is not None:
            name = os.path.abspath(frame.f_code.co_filename)
            if self.user_dir and name.startswith(self.user_dir + os.sep):
                return f"{os.path.basename(name)}:{frame.f_lineno}"
            if fallback is None and not name.startswith(_OWN) and "site-packages" not in name:
                fallback = f"{os.path.basename(name)}:{frame.f_lineno}"
            frame = frame.f_back
        return fallback or "?"

    def _note(self, what: str) -> None:
        key = f"{what} at {self._where()}"
        self.switched[key] = self.switched.get(key, 0) + 1

    # ------------------------------------------------------------------ weights
    def _module_cast(self, name: str):
        sw = self

        def make(orig):
            def cast(module, *args, **kwargs):
                if name == "to":
                    device, dtype, non_blocking, fmt = _parse_to(*args, **kwargs)
                else:
                    device, dtype, non_blocking, fmt = None, _METHOD_DTYPE[name], False, None
                floating = any(t.is_floating_point() for t in (*module.parameters(), *module.buffers()))
                if dtype not in LOW or not floating:
                    return orig(module, *args, **kwargs)
                if sw.mode != "fp32":
                    where = device if device is not None else next(module.parameters(), torch.empty(0)).device
                    sw.low_weights.add(f"{torch.device(where).type}:{_dname(dtype)}")
                    return orig(module, *args, **kwargs)
                sw._note(f"{type(module).__name__}.{name}({_dname(dtype)})")
                if device is None:
                    return module
                extra = {"memory_format": fmt} if fmt is not None else {}
                return orig(module, device, non_blocking=non_blocking, **extra)

            return cast

        return make

    def _default_dtype(self, orig):
        sw = self

        def set_default_dtype(d):
            if d in LOW and sw.mode == "fp32":
                sw._note(f"torch.set_default_dtype({_dname(d)})")
                return None
            if d in LOW:
                sw.low_weights.add(f"{torch.get_default_device().type}:{_dname(d)}")
            return orig(d)

        return set_default_dtype

    def patch_hf(self, module: Any, patch: Callable) -> None:
        """``PreTrainedModel.from_pretrained(dtype=/torch_dtype= low or "auto")`` loads FP32 in the FP32 runs."""
        cls = getattr(module, "PreTrainedModel", None)
        raw = cls.__dict__.get("from_pretrained") if cls is not None else None
        if not isinstance(raw, classmethod):
            return
        sw, func = self, raw.__func__

        def from_pretrained(klass, *args, **kwargs):
            for key in ("dtype", "torch_dtype"):
                value = kwargs.get(key)
                low = value in LOW or value in ("auto", "bfloat16", "float16", "half")
                if low:
                    sw._note(f"from_pretrained({key}={_dname(value)})")
                    kwargs[key] = torch.float32
            return func(klass, *args, **kwargs)

        patch(cls, "from_pretrained", lambda _bound: classmethod(from_pretrained))

    # ------------------------------------------------------------------ inputs follow the weights
    def _tensor_cast(self, name: str):
        sw = self

        def make(orig):
            def cast(t, *args, **kwargs):
                if name == "to":
                    device, dtype, non_blocking, fmt = _parse_to(*args, **kwargs)
                else:
                    device, dtype, non_blocking, fmt = None, _METHOD_DTYPE[name], False, None
                if dtype not in LOW or not t.is_floating_point() or t.dtype in LOW or torch.compiler.is_compiling():
                    return orig(t, *args, **kwargs)
                sw._note(f"Tensor.{name}({_dname(dtype)})")
                if name != "to":
                    return t
                extra = {"memory_format": fmt} if fmt is not None else {}
                copy = bool(kwargs.get("copy", False))
                return orig(t, device, t.dtype, non_blocking, copy, **extra) if device is not None else \
                    orig(t, t.dtype, non_blocking, copy, **extra)

            return cast

        return make

    def _inputs_follow_weights(self, module, args):
        own = next(module.parameters(recurse=False), None)
        if own is not None and own.dtype in LOW:
            self._refuse(own, f"{type(module).__name__}'s parameter")
        if not any(isinstance(a, torch.Tensor) and a.dtype in LOW for a in args):
            return None
        if own is None or own.dtype != torch.float32:
            return None
        self._inputs_cast += 1
        if self._inputs_cast == 1:
            self._note(f"low-precision input of {type(module).__name__} cast to float32")
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype in LOW else a for a in args)

    # ------------------------------------------------------------------ what switching cannot undo
    def check_params(self, optimizer: Any) -> None:
        """At the first optimizer step of an FP32 run: every parameter must be FP32, else refuse, naming it."""
        for group in getattr(optimizer, "param_groups", []):
            for p in group.get("params", []):
                if isinstance(p, torch.Tensor) and p.dtype in LOW:
                    self._refuse(p, "a parameter")

    def note_low_params(self, optimizer: Any) -> None:
        """At the first optimizer step of an AMP run: parameters in BF16/FP16, however they were made, are the
        precision of a pure-low-precision script (the FP32 run then refuses those it cannot keep FP32, by name)."""
        for group in getattr(optimizer, "param_groups", []):
            for p in group.get("params", []):
                if isinstance(p, torch.Tensor) and p.dtype in LOW:
                    self.low_weights.add(f"{p.device.type}:{_dname(p.dtype)}")

    def _refuse(self, p: torch.Tensor, what: str) -> None:
        done = "; ".join(self.switched) or "none"
        name = _dname(p.dtype)
        raise self.refusal(
            f"{what} of shape {tuple(p.shape)} is still {name} in the FP32 run at {self._where()} although the "
            f"conversions ampkit knows were made no-ops (switched: {done}): it was created in low precision directly "
            f"(e.g. nn.Linear(..., dtype=torch.{name}), a tensor factory with dtype=, or loaded from a {name} file); "
            f"create it in float32 and convert the model with model.to(torch.{name}) so that the FP32 run can keep "
            f"it FP32")
