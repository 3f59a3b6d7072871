"""How far an op's result may be from an exact reference before it is a difference, not rounding.

Every op the script runs on the device is replayed on the same inputs (copied, in FP64) on the reference
device. The difference is judged against a bound that follows from the op and the dtype it ran in, so that the
rounding mixed precision is allowed to cause is never reported:

* ``u`` is the unit roundoff of the dtype the op's result is stored in: ``2^-8`` for BF16, ``2^-11`` for FP16,
  ``2^-24`` for FP32 (``2^-11`` for matmuls and convolutions in FP32 off the CPU, where TF32 may round their
  inputs); ``u_acc`` that of the accumulation: FP32 for low-precision kernels on the CPU; on an accelerator, the
  result's own dtype for BF16/FP16 matmuls and convolutions, whose libraries may sum partial products in it
  (torch's ``allow_bf16_reduced_precision_reduction`` / ``allow_fp16_reduced_precision_reduction``, on by
  default).
* **Pointwise** ops (``add``, ``exp``, ``gelu``, casts, ...): ``|x - ref| <= 8 u |ref| + 4 tiny``, a few ULPs
  of the result (``tiny``: the dtype's smallest normal number, for results that underflow).
* **Matmuls and convolutions** (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``convolution``): the classic bound of a
  dot product of length ``K``, ``|x - ref| <= 8 u |ref| + g(K) u_acc (|A| @ |B|)`` with ``g(K) = min(K, 4 sqrt(K) +
  8)``; ``|A| @ |B|`` (the same op on the inputs' magnitudes) is what makes the bound aware of cancellation: a
  result that is small because large terms cancel may be off by much more than its own ULPs.
* **Reductions and normalisations** (``sum``, ``mean``, ``softmax``, ``layer_norm``, norms, ...), normwise:
  ``|x - ref| <= 8 u |ref| + (8 u + g(n) u_acc) max|ref|`` over the reduced length ``n``.
* **Fused attention** (SDPA's flash, memory-efficient and cuDNN kernels, forward and backward), normwise per
  output, since their intermediate probabilities are stored in the low-precision dtype:
  ``|x - ref| <= 8 u |ref| + 16 u max|ref|`` with ``u`` that of the inputs' dtype (for the FP32 log-sum-exp too).
* Pointwise ops of several terms (``add``/``sub`` with ``alpha``, ``addcmul``, ``addcdiv``, ``lerp``) add
  ``8 u`` times the sum of the terms' magnitudes, since the terms are rounded before they are summed.

Results beyond the dtype's range are allowed to be inf (FP16 overflow is the dtype's, not the device's), and a
result that is NaN or inf in both is equal. The ratio ``max(|x - ref| / bound)`` is reported; above 1 is a
difference.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["kind_of", "unit_roundoff", "excess", "magnitude_args", "reference_args", "MATMUL", "REDUCTION"]

_TERMS = {"add", "sub", "rsub", "addcmul", "addcdiv", "lerp", "add_", "sub_", "addcmul_", "addcdiv_", "lerp_"}

MATMUL = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "matmul", "addbmm", "mv", "dot",
          "_scaled_mm", "convolution_backward"}
REDUCTION = {"sum", "mean", "_softmax", "_log_softmax", "softmax", "log_softmax", "native_layer_norm",
             "native_group_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "logsumexp", "cumsum", "_fused_rms_norm",
             "native_layer_norm_backward", "native_group_norm_backward", "native_batch_norm_backward",
             "_softmax_backward_data", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
             "mse_loss", "cross_entropy_loss", "embedding_dense_backward", "prod", "cumprod"}
_C = 8.0


def kind_of(name: str) -> str:
    """``"matmul"``, ``"attention"``, ``"reduction"`` or ``"pointwise"`` for an aten op's base name
    (``aten.mm.default`` -> mm)."""
    if name in MATMUL:
        return "matmul"
    if "attention" in name or "scaled_dot_product" in name:
        return "attention"
    if name in REDUCTION or name.endswith("_backward") and "norm" in name:
        return "reduction"
    return "pointwise"


def unit_roundoff(dtype: torch.dtype) -> float:
    return {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
            torch.float16: 2.0**-11}.get(dtype, 2.0**-24)


def _g(n: int) -> float:
    return float(min(n, 4 * math.sqrt(max(n, 1)) + 8))


def _length(name: str, args: tuple) -> int:
    """The length of the dot products (matmuls) or of the reduction, from the op's first input(s)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return 1
    first = tensors[0]
    if name in ("mm", "bmm", "matmul", "mv", "dot"):
        return int(first.shape[-1]) if first.dim() else 1
    if name in ("addmm", "baddbmm", "addbmm") and len(tensors) >= 2:
        return int(tensors[1].shape[-1])
    if name.startswith("convolution") or name == "_convolution":
        w = tensors[1] if len(tensors) > 1 else first
        return int(w[0].numel()) if w.dim() else 1
    return max(int(first.shape[-1]) if first.dim() else 1, 1)


def excess(name: str, out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor | None, args: tuple,
           on_cpu: bool) -> tuple[float, float]:
    """``(max |out - ref| / bound, max |out - ref|)`` for one floating-point result; ``ref`` and ``magnitude``
    (the op on the inputs' magnitudes, matmuls only) are FP64 on the same device as ``out`` converted."""
    dtype = out.dtype
    x = out.detach().to(ref.device, torch.float64)
    kind = kind_of(name)
    u = unit_roundoff(dtype)
    u_acc = unit_roundoff(torch.float32) if dtype in (torch.bfloat16, torch.float16) else u
    if kind == "matmul" and dtype == torch.float32 and not on_cpu:
        u_acc = 2.0**-11  # TF32 may round the inputs of FP32 matmuls and convolutions on an accelerator
    elif kind == "matmul" and not on_cpu:
        u_acc = u  # reduced-precision reductions (split-K partial sums in BF16/FP16), torch's default on GPUs
    if kind == "attention":  # its probabilities and partial sums are kept in the inputs' dtype
        u = max([u] + [unit_roundoff(a.dtype) for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()])
    tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
    bound = _C * u * ref.abs() + 4 * tiny
    if kind == "matmul" and magnitude is not None:
        bound = bound + _g(_length(name, args)) * u_acc * magnitude.abs()
    elif kind in ("reduction", "attention"):
        finite = ref[torch.isfinite(ref)]
        top = float(finite.abs().max()) if finite.numel() else 0.0
        extra = 16 * u if kind == "attention" else _C * u + _g(_length(name, args)) * u_acc
        bound = bound + extra * top
    elif magnitude is not None:  # pointwise of several rounded terms
        bound = bound + _C * u * magnitude.abs()
    both_bad = ~torch.isfinite(x) & ~torch.isfinite(ref) & ((x == ref) | (torch.isnan(x) & torch.isnan(ref)))
    overflow = torch.isinf(x) & (ref.abs() > torch.finfo(dtype).max) & (torch.sign(x) == torch.sign(ref))
    ok = both_bad | overflow
    diff = (x - ref).abs()
    diff = torch.where(ok, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    ratio = diff / bound.clamp_min(1e-300)
    if ratio.numel() == 0:
        return 0.0, 0.0
    return float(ratio.max()), float(diff.max())


def magnitude_args(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The op's inputs and scalars as magnitudes, for ops whose bound needs ``|A| @ |B|`` (matmuls) or the sum of
    their terms' magnitudes (``add``/``sub`` with alpha, ``addcmul``, ``addcdiv``); None for other ops. ``sub`` and
    ``rsub`` become ``add`` of the magnitudes."""
    if kind_of(name) != "matmul" and name not in _TERMS:
        return None

    def mag(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.abs()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return abs(v)
        return v

    return tuple(mag(a) for a in args), {k: mag(v) for k, v in kwargs.items()}


def reference_args(value: Any, device: torch.device) -> Any:
    """An input for the FP64 replay: floating tensors as FP64 copies on ``device``, other tensors copied, floating
    dtypes asked for by the op (``dtype=torch.bfloat16``) replaced by FP64, devices by ``device``."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to(device)
        return t.to(torch.float64) if t.is_floating_point() else t
    if isinstance(value, torch.dtype):
        return torch.float64 if value.is_floating_point else value
    if isinstance(value, torch.device):
        return device
    if isinstance(value, (list, tuple)):
        return type(value)(reference_args(v, device) for v in value)
    if isinstance(value, dict):
        return {k: reference_args(v, device) for k, v in value.items()}
    return value
