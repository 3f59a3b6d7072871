"""The first aten op that produced inf/NaN, its own line in the user's code, and why it happened.

Used by the non-finite locator when it re-runs one module (:mod:`~ampkit.diagnose.nonfinite`):

* forward: :func:`first_nonfinite_op` runs the module inside a
  :class:`~torch.utils._python_dispatch.TorchDispatchMode` and stops at the first op that precision made
  inf/NaN; the Python stack at that dispatch holds the user's line that called the op;
* backward: :func:`first_nonfinite_backward` re-runs the forward with autograd's anomaly recording
  (each autograd node keeps the stack that created it), hooks every node of the graph and runs the
  backward: the first node that turns finite gradients into inf/NaN names the forward line that
  created it.

Precision is measured, not guessed: each op whose FP16/BF16 output holds inf/NaN is recomputed in FP32 on
the same inputs (:func:`fp32_reference`); only an element that FP32 gives finite is precision's doing
(:func:`precision_made`). Values that are inf/NaN by design (a mask filled with -inf, an additive mask,
-inf padding) and their propagation are the same in FP32, so they are never overflows.

Each hit is classified (:func:`classify`): an overflow (finite inputs, a result beyond the dtype's
largest value, or a constant that does not fit it), an underflow (a divisor that is 0 in the low
precision, often a small constant or eps that rounded to 0), a cancellation (the root or log of a
negative difference of nearly equal numbers), or inputs that were already non-finite.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.diagnose.tracking import UserCode, frame_where, short_path, tensor_leaves

__all__ = ["OpHit", "created_at", "first_nonfinite_op", "first_nonfinite_backward", "classify", "fp32_reference", "precision_made", "OVERFLOW", "UNDERFLOW",
           "CANCELLATION", "NONFINITE_INPUTS", "DIVISION_BY_ZERO"]

OVERFLOW, UNDERFLOW, CANCELLATION, NONFINITE_INPUTS = "overflow", "underflow", "cancellation", "non-finite inputs"
DIVISION_BY_ZERO = "division by zero"
_DIVIDING = {"aten.div", "aten.reciprocal", "aten.rsqrt", "aten.log", "aten.log2", "aten.log10", "aten.pow",
             "aten.remainder", "aten.fmod", "aten.true_divide"}
_ROOTS = {"aten.sqrt", "aten.rsqrt", "aten.log", "aten.log2", "aten.log10", "aten.log1p", "aten.pow"}


@dataclass(frozen=True)
class OpHit:
    """The first aten op that produced inf/NaN. ``where``: the user's ``file:line`` that ran it
    (backward: the forward line that created the autograd node); ``cause``: one of :data:`OVERFLOW`,
    :data:`UNDERFLOW`, :data:`CANCELLATION`, :data:`NONFINITE_INPUTS` or ``""`` (not classified);
    ``detail``: the sentence with the numbers."""

    op: str
    out_dtype: str
    input_max: tuple[float, ...]
    inputs_finite: bool
    module: Any = field(default=None, compare=False)  # the innermost module running the op (re-run)
    where: str | None = None
    cause: str = ""
    detail: str = ""
    precision: bool = False  # measured: the same op on the same inputs in FP32 is finite where this one is not

    def describe(self) -> str:
        mags = ", ".join(_fmt(m) for m in self.input_max) or "no tensor inputs"
        text = f"`{self.op}` ({self.out_dtype}) on inputs with max |x| {mags}"
        if self.detail:
            return f"{text}: {self.cause}: {self.detail}" if self.cause else f"{text}: {self.detail}"
        if not self.inputs_finite:
            text += " (its inputs were already non-finite)"
        return text


def _fmt(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _op_name(func) -> str:
    text = str(func)
    return text.rsplit(".", 1)[0] if text.count(".") >= 2 else text


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _smallest(dtype: torch.dtype) -> float:
    """The smallest positive (subnormal) value of ``dtype``."""
    fi = torch.finfo(dtype)
    return fi.tiny * fi.eps


def _fp32(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float32, copy=True) if obj.is_floating_point() else obj.detach().clone()
    if isinstance(obj, (tuple, list)):
        return type(obj)(_fp32(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _fp32(v) for k, v in obj.items()}
    return obj


def _scalars(args, kwargs) -> list[float]:
    return [a for a in list(args) + list((kwargs or {}).values()) if isinstance(a, float) and math.isfinite(a)]


@dataclass
class _Tiny:
    """A constant the op got that rounds to 0 in its dtype (``eps=1e-12`` in FP16)."""

    value: float
    op: str
    dtype: torch.dtype
    where: str | None


# Ops whose output is not computed from their inputs: uninitialised memory (``empty_like`` under dropout, whose
# bits may read as inf/NaN until they are filled) and random draws. Their values say nothing about precision.
_NO_VALUES = ("empty", "rand", "bernoulli", "uniform", "normal", "exponential", "multinomial")


def _computes(func) -> bool:
    name = _op_name(func)
    return not any(word in name for word in _NO_VALUES)


def fp32_reference(func, args, kwargs) -> list[torch.Tensor] | None:
    """The op's outputs recomputed in FP32 on the same inputs (upcast), or None when it cannot run so."""
    try:
        ref = func(*_fp32(args), **_fp32(kwargs or {}))
    except Exception:  # noqa: BLE001 - an op that cannot run in FP32 here: no reference
        return None
    return tensor_leaves(ref)


def precision_made(outs: list[torch.Tensor], refs: list[torch.Tensor] | None) -> bool:
    """Measured: some element is inf/NaN in the low-precision output and finite in the FP32 recompute.
    An element that is inf/NaN in both (a mask of -inf, its propagation, 0/0) is no precision defect."""
    if not refs or len(refs) != len(outs):
        return False
    for out, ref in zip(outs, refs):
        if out.dtype not in (torch.float16, torch.bfloat16) or out.shape != ref.shape:
            continue
        if bool((~torch.isfinite(out) & torch.isfinite(ref)).any()):
            return True
    return False


def classify(func, args, kwargs, out: torch.Tensor, tiny: _Tiny | None = None,
             refs: list[torch.Tensor] | None = None) -> tuple[str, str]:
    """``(cause, detail)`` for an op whose output ``out`` is inf/NaN (see the module docstring); ``refs``:
    the op recomputed in FP32 (:func:`fp32_reference`), computed here when not given."""
    name, dtype = _op_name(func), out.dtype
    dn = _dtype_name(dtype)
    ins = tensor_leaves((args, kwargs or {}))
    if refs is None:
        refs = fp32_reference(func, args, kwargs)
    fmax = torch.finfo(dtype).max
    big = [s for s in _scalars(args, kwargs) if abs(s) > fmax]
    if big:
        return OVERFLOW, (f"the constant {big[0]:g} does not fit {dn} (largest finite value {fmax:g}): it becomes "
                          f"{'-' if big[0] < 0 else ''}inf")
    if refs and precision_made([out], refs[:1]):
        ref = refs[0]
        lost = ~torch.isfinite(out) & torch.isfinite(ref)
        peak = float(ref[lost].abs().max()) if bool(lost.any()) else 0.0
        if peak > fmax:
            return OVERFLOW, (f"in FP32 the result reaches {peak:.3g}, beyond {dn}'s largest finite value "
                              f"{fmax:g}")
        if not all(bool(torch.isfinite(t).all()) for t in ins):
            return "", f"in FP32 the same op on the same inputs gives finite values there (max |x| {peak:.3g})"
    elif not all(bool(torch.isfinite(t).all()) for t in ins):
        return NONFINITE_INPUTS, "its inputs were already inf/NaN: the value went bad before this op"
    if name in _ROOTS and any(bool((t < 0).any()) for t in ins if t.is_floating_point()):
        low = min(float(t.min()) for t in ins if t.is_floating_point() and t.numel())
        return CANCELLATION, (f"the root/log of a negative value (min {low:.3g}): a difference of nearly equal "
                              f"numbers (e.g. E[x^2] - E[x]^2) cancelled below 0 in {dn}")
    zeros = any(bool((t == 0).any()) for t in ins if t.is_floating_point())
    if name in _DIVIDING and zeros:
        text = f"it divides by 0 (0/0 gives NaN, x/0 inf) in {dn}"
        if tiny is None:
            return DIVISION_BY_ZERO, text + " (a divisor is exactly 0: an all-zero row, or a value that underflowed)"
        at = f" at {tiny.where}" if tiny.where else ""
        return UNDERFLOW, (f"the constant {tiny.value:g}{at} (`{tiny.op}`) rounds to 0 in {_dtype_name(tiny.dtype)} "
                           f"(smallest positive value {_smallest(tiny.dtype):.3g}), so it no longer keeps the "
                           f"divisor above 0: {text}")
    if refs is None:
        return "", "the op could not be recomputed in FP32 here, so precision is not measured"
    if precision_made([out], refs[:1]):
        return "", "in FP32 the same op on the same inputs gives finite values"
    return "", "the op gives inf/NaN in FP32 too, on these inputs: not a precision problem"


class _FirstNonFinite(TorchDispatchMode):
    def __init__(self, user: UserCode | None, stop=None) -> None:
        super().__init__()
        self.user = user
        self.stop = stop  # the frame that started the re-run: user frames outside it are not the op's
        self.hit: OpHit | None = None
        self.structural: OpHit | None = None  # finite inputs, inf/NaN in FP32 too (a mask, a singular point)
        self.fallback: OpHit | None = None
        self.same_in_fp32: set[tuple[int | None, str]] = set()  # (id(module), op) whose inf/NaN FP32 shares
        self.tiny: _Tiny | None = None
        self.stack: list[torch.nn.Module] = []  # modules running (filled by first_nonfinite_op's hooks)

    def _where(self) -> str | None:
        if self.user is None:
            return None
        f = sys._getframe(1)
        while f is not None and f is not self.stop:
            if self.user.is_user_file(f.f_code.co_filename):
                return frame_where(f)
            f = f.f_back
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.hit is not None:
            return out
        outs = tensor_leaves(out)
        if self.tiny is None and outs and outs[0].dtype in (torch.float16, torch.bfloat16):
            small = [s for s in _scalars(args, kwargs) if 0 < abs(s) < _smallest(outs[0].dtype) / 2]
            if small:
                self.tiny = _Tiny(small[0], _op_name(func), outs[0].dtype, self._where())
        if outs and _computes(func) and not all(bool(torch.isfinite(t).all()) for t in outs):
            self._note(func, args, kwargs, outs)
        return out

    def _note(self, func, args, kwargs, outs: list[torch.Tensor]) -> None:
        """An op whose output holds inf/NaN: a precision hit when FP32 measures it finite there (or a constant
        does not fit the dtype), else a structural one (finite inputs: a mask, a singular point), else it
        only carries an earlier inf/NaN along."""
        ins = tensor_leaves((args, kwargs or {}))
        finite = all(bool(torch.isfinite(t).all()) for t in ins)
        low = any(t.dtype in (torch.float16, torch.bfloat16) for t in outs)
        refs = fp32_reference(func, args, kwargs) if low else None
        fmax = torch.finfo(outs[0].dtype).max
        precision = precision_made(outs, refs) or (low and finite and any(abs(v) > fmax for v in _scalars(args, kwargs)))
        if not (precision or finite) and self.fallback is not None:
            self.same_in_fp32.add((id(self.stack[-1]) if self.stack else None, _op_name(func)))
            return
        mags = tuple(float(t.detach().abs().max().float()) if t.numel() else 0.0 for t in ins)
        cause, detail = (classify(func, args, kwargs, outs[0], self.tiny, refs) if finite or precision
                         else (NONFINITE_INPUTS, ""))
        # A divisor that is 0 only because a constant (an eps) rounded to 0 in FP16/BF16: precision's doing too,
        # measured on the constant (it is 0 in the low dtype and not in FP32), though the division itself is 0/0.
        precision = precision or cause == UNDERFLOW
        if not precision:
            self.same_in_fp32.add((id(self.stack[-1]) if self.stack else None, _op_name(func)))
        hit = OpHit(_op_name(func), _dtype_name(outs[0].dtype), mags[:4], finite,
                    self.stack[-1] if self.stack else None, self._where(), cause, detail, precision)
        if precision:
            self.hit = hit
        elif finite:
            if self.structural is None:
                self.structural = hit
        elif self.fallback is None:
            self.fallback = hit


def first_nonfinite_op(fn: Callable[[], Any], user: UserCode | None = None, tiny: _Tiny | None = None,
                       same_in_fp32: set | None = None) -> OpHit | None:
    """Run ``fn`` and return the first aten op that precision made inf/NaN (measured: the op recomputed in
    FP32 on the same inputs is finite there), else the first whose output is inf/NaN while its inputs are
    finite (inf/NaN in FP32 too: a mask of -inf, a singular point), else the first inf/NaN op at all;
    with the innermost module that ran it and, given ``user``, the user's line that called it.
    ``same_in_fp32`` collects ``(id(module), op)`` of every op whose inf/NaN FP32 gives as well."""
    mode = _FirstNonFinite(user, sys._getframe())
    mode.tiny = tiny  # a constant the forward rounded to 0 explains a division by 0 in the backward

    def enter(module, args):
        mode.stack.append(module)

    def leave(module, args, *rest):  # returns None: a forward hook's return value replaces the output
        if mode.stack:
            mode.stack.pop()

    mm = torch.nn.modules.module
    handles = [mm.register_module_forward_pre_hook(enter), mm.register_module_forward_hook(leave, always_call=True)]
    try:
        with mode:
            fn()
    finally:
        for h in handles:
            h.remove()
    if same_in_fp32 is not None:
        same_in_fp32.update(mode.same_in_fp32)
    return mode.hit or mode.structural or mode.fallback


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def created_at(node, user: UserCode) -> str | None:
    """The innermost user line in the stack anomaly mode recorded when ``node`` was created."""
    stack = list(node.metadata.get("traceback_") or []) if hasattr(node, "metadata") else []
    start = next((i for i, e in enumerate(stack) if __file__ in e and "first_nonfinite_backward" in e), -1)
    for entry in reversed(stack[start + 1:]):  # the frames of the re-run only, not those that started it
        m = _FRAME.search(entry)
        if m and user.is_user_file(m["file"]):
            return f"{short_path(m['file'])}:{m['line']}"
    return None


def _graph_nodes(outs: list[torch.Tensor], limit: int = 50_000) -> list:
    seen, order, todo = set(), [], [t.grad_fn for t in outs if t.grad_fn is not None]
    while todo and len(order) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        todo.extend(n for n, _ in node.next_functions if n is not None)
    return order


def _finite(ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts if isinstance(t, torch.Tensor) and t.is_floating_point())


def first_nonfinite_backward(forward: Callable[[], Any], inputs: list[torch.Tensor], grads: list[torch.Tensor],
                             user: UserCode) -> OpHit | None:
    """Run ``forward()`` (recording where each autograd node is created), then its backward from
    ``grads``; return the first backward op that made finite gradients inf/NaN, its ``where`` being the
    forward line that created the node. None when the backward stays finite or cannot be re-run."""
    seen = _FirstNonFinite(user, sys._getframe())  # notes constants that round to 0 in the forward
    with torch.autograd.set_detect_anomaly(True, check_nan=False), seen:
        out = forward()
    outs = [t for t in tensor_leaves(out) if t.requires_grad]
    if not inputs or len(grads) < len(outs) or not outs:
        return None
    culprit: list = []

    def hook(node, grad_inputs, grad_outputs):
        if not culprit and _finite(grad_outputs) and not _finite(grad_inputs):
            culprit.append(node)

    handles = [n.register_hook(lambda gi, go, n=n: hook(n, gi, go)) for n in _graph_nodes(outs)]
    try:
        hit = first_nonfinite_op(lambda: torch.autograd.grad(outs, inputs, grads[: len(outs)], allow_unused=True),
                                 tiny=seen.tiny)
    finally:
        for h in handles:
            h.remove()
    if not culprit:
        return hit
    node = culprit[0]
    where = created_at(node, user)
    fwd = re.sub(r"Backward\d*$", "", node.name())
    if hit is None:
        return OpHit(fwd, "", (), True, where=where, detail=f"the backward of `{fwd}` ({node.name()}) gave inf/NaN")
    detail = (hit.detail or "on finite gradients") + f" (in the backward of `{fwd}`, {node.name()})"
    return OpHit(hit.op, hit.out_dtype, hit.input_max, hit.inputs_finite, None, where or hit.where, hit.cause, detail,
                 hit.precision)
