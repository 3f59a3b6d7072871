"""Recording for :mod:`ampkit.verify.audit`: every aten op of a pass, with its module, phase and dtypes.

A ``TorchDispatchMode`` (:class:`_Recorder`) sees each op after autocast has cast its inputs; a
``TorchFunctionMode`` (:class:`_AutocastState`) notes whether autocast was on when the torch function
was called; forward pre/post hooks (:func:`_module_hooks`) keep the stack of module names. The
categories are explained in :mod:`ampkit.verify.audit`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["OpRecord", "CATEGORIES", "LOW", "OUTSIDE", "BACKWARD", "BY_TORCH_RULE"]

CATEGORIES = ("low", "promoted", "fp32", "fp64", "cast")
LOW = (torch.float16, torch.bfloat16)
OUTSIDE = "(outside the model)"
BACKWARD = "(backward)"
_SHORT = {"float32": "FP32", "float64": "FP64", "float16": "FP16", "bfloat16": "BF16"}

# Ops that move or allocate memory without computing: not counted.
_NO_COMPUTE = {
    "detach", "alias", "lift_fresh", "lift_fresh_copy", "empty", "empty_like", "empty_strided", "zeros", "ones",
    "zeros_like", "ones_like", "full", "full_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones",
    "new_full", "fill_", "zero_", "clone", "_unsafe_view", "contiguous", "scalar_tensor", "arange",
    "_local_scalar_dense", "set_", "resize_", "copy", "randperm", "_to_copy_noop",
}
_CASTS = {"_to_copy", "copy_", "to", "_to_dtype", "to_dtype"}
# Matmul-like ops whose FLOPs torch's flop counter knows; anything else in the registry counts too.
_MATMUL_NAMES = {
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution", "convolution_backward",
    "_scaled_mm", "_slow_conv2d_forward", "cudnn_convolution", "convolution_overrideable",
}


def _flop_registry() -> dict[Any, Callable[..., int]]:
    try:  # semi-private but stable since torch 2.1; without it FLOPs are simply 0
        from torch.utils.flop_counter import flop_registry
    except ImportError:  # pragma: no cover
        return {}
    return flop_registry


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class OpRecord:
    """One aten op as it ran: where (module path), when (forward/backward), in which dtypes."""

    op: str
    module: str
    module_type: str
    phase: str
    category: str
    in_dtypes: tuple[str, ...]
    out_dtypes: tuple[str, ...]
    flops: int
    autocast: bool
    matmul: bool
    by_rule: str = ""  # the torch function whose own rule chose this op's dtype (BY_TORCH_RULE), else ""


# Torch functions that pick the dtype of their inner ops themselves: the math kernel of scaled_dot_product_attention
# upcasts FP16/BF16 query and key to FP32 for its softmax and dropout (HF GPT-2 and BERT in training, on the CPU and
# wherever the fused kernels do not apply). Their FP32 matmuls are torch's rule, not a surprise the user can fix.
BY_TORCH_RULE = frozenset({"scaled_dot_product_attention"})



# ---------------------------------------------------------------------------------------- recording
class _State:
    def __init__(self, names: dict[int, tuple[str, str]], root_type: str) -> None:
        self.stack: list[tuple[str, str]] = []
        self.names = names
        self.root_type = root_type
        self.phase = "forward"
        self.autocast_at_call = False
        self.by_rule = ""  # inside a BY_TORCH_RULE function
        self.recording = True
        self.root_output: Any = None
        self.records: list[OpRecord] = []
        self.from_low = WeakTensorKeyDictionary()  # FP32 tensors that carry low-precision values


class _AutocastState(TorchFunctionMode):
    """Notes whether autocast was on when each torch function was called (the dispatcher can't tell)."""

    def __init__(self, state: _State, device_type: str) -> None:
        super().__init__()
        self.state = state
        self.device_type = device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        prev, rule = self.state.autocast_at_call, self.state.by_rule
        self.state.autocast_at_call = torch.is_autocast_enabled(self.device_type)
        if not rule and getattr(func, "__name__", "") in BY_TORCH_RULE:
            self.state.by_rule = func.__name__
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.state.autocast_at_call, self.state.by_rule = prev, rule


class _Recorder(TorchDispatchMode):
    def __init__(self, state: _State) -> None:
        super().__init__()
        self.state = state
        self.flops = _flop_registry()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.state.recording:
            try:
                self._record(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - never let bookkeeping break the user's model
                pass
        return out

    def _record(self, func, args, kwargs, out) -> None:
        st = self.state
        name = func.overloadpacket.__name__
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        carried = any(t.dtype in LOW or t in st.from_low for t in ins if t.is_floating_point())
        if func.is_view or name in _NO_COMPUTE:
            if carried:  # a view of a low-precision-derived tensor stays derived
                for t in outs:
                    if t.dtype == torch.float32:
                        st.from_low[t] = True
            return
        in_f = [t.dtype for t in ins if t.is_floating_point()]
        out_f = [t.dtype for t in outs if t.is_floating_point()]
        if not out_f:
            return  # integer/bool results (argmax, comparisons): not a precision question
        if name in _CASTS:
            if set(in_f) == set(out_f):
                return
            category = "cast"
        elif any(d in LOW for d in out_f):
            category = "low"
        elif torch.float64 in out_f:
            category = "fp64"
        elif carried:
            category = "promoted"
        else:
            category = "fp32"
        if carried or category == "cast" and any(d in LOW for d in in_f):
            for t in outs:
                if t.dtype == torch.float32:
                    st.from_low[t] = True
        flops = 0
        packet = func.overloadpacket
        is_mm = name in _MATMUL_NAMES or packet in self.flops
        if packet in self.flops:
            with contextlib.suppress(Exception):
                flops = int(self.flops[packet](*args, **kwargs, out_val=out))
        if st.phase == "backward":
            module, mtype = BACKWARD, ""
        elif st.stack:
            module, mtype = st.stack[-1]
        else:
            module, mtype = OUTSIDE, ""
        st.records.append(OpRecord(
            op=name, module=module, module_type=mtype, phase=st.phase, category=category,
            in_dtypes=tuple(_dtype_name(d) for d in in_f), out_dtypes=tuple(_dtype_name(d) for d in out_f),
            flops=flops, autocast=bool(st.autocast_at_call and st.phase == "forward"), matmul=is_mm,
            by_rule=st.by_rule if st.phase == "forward" else "",
        ))


@contextlib.contextmanager
def _module_hooks(model: nn.Module, state: _State) -> Iterator[None]:
    handles = []
    for name, mod in model.named_modules():
        label = name or f"({type(mod).__name__})"
        entry = (label, type(mod).__name__)

        def pre(_m, _inp, entry=entry):
            state.stack.append(entry)

        def post(_m, _inp, out, entry=entry, root=name == ""):
            if state.stack and state.stack[-1] == entry:
                state.stack.pop()
            if root and state.root_output is None and state.phase == "forward":
                state.root_output = _first_tensor(out)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _first_tensor(obj: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)), None)


