"""A simulated MUSA *device* for running ported training scripts on a CPU-only torch.

tests/musa_sim.py simulates the ``torch.musa`` API; this module adds what that cannot: tensors that
really live on a device named "musa", so a script ported by ``ampkit migrate --target musa`` can be
run for a few steps and watched (where its parameters are, which autocast and GradScaler it used).

How (torch >= 2.5, CPU build):

* ``torch.utils.backend_registration._setup_privateuseone_for_python_backend("musa", ...)``: renames
  the PrivateUse1 backend to "musa" (as torch_musa does), registers the simulated ``torch.musa``
  module (``torch._register_device_module``), a Python device guard and PrivateUse1 hooks, so
  ``torch.device("musa")``, ``Tensor.musa()``, ``Tensor.is_musa``, ``Module.musa()`` and
  ``torch.accelerator.current_accelerator()`` (-> musa) work.
* A tensor on "musa" is a :class:`MusaTensor`: a ``__torch_dispatch__`` wrapper subclass
  (``device="musa:0"``) over a CPU tensor. Every aten op on it runs the CPU kernel on the inner
  tensors and wraps the results again; autograd runs on the wrappers (``AutogradPrivateUse1``).
* Kernels a GPU has and the CPU lacks: ``lstm_cell``/``gru_cell`` pick the fused
  ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` on every device but the CPU; here they (and their
  backwards) are written in CPU ops, checked against the CPU's own LSTM and GRU.
* Factory functions with ``device="musa"`` reach the PrivateUse1 backend key: ``empty.memory_format``
  and ``empty_strided`` are registered there (``torch.library``), so ``torch.zeros``, ``randn``,
  ``arange``, ``full``, ``tensor(..., device=)`` and the copy in ``x.to("musa")`` (``_to_copy`` =
  ``empty_strided`` + ``copy_``) all make MusaTensors. (No TorchDispatchMode is needed.)
* Autocast: ``torch.autocast("musa", ...)`` maps to the ``AutocastPrivateUse1`` key. Upstream
  registers no kernels for it (torch_musa brings its own), so this module registers upstream's CUDA
  op lists there (MUSA.md: torch_musa's lists are upstream's CUDA lists): matmul/conv/linear/SDPA in
  the autocast dtype, losses/norms/softmax/exp/log/pow in FP32, promote ops to the widest type,
  ``binary_cross_entropy`` refused; every other op falls through.
* GradScaler: ``torch.musa.amp.GradScaler()`` (a subclass of ``torch.amp.GradScaler("musa")``) and
  ``torch.amp.GradScaler("musa")`` run on the CPU's ``_amp_foreach_non_finite_check_and_unscale_`` /
  ``_amp_update_scale_`` kernels through the wrapper.
* RNG: random ops on musa tensors draw from a generator of their own (``torch.musa.manual_seed``,
  ``get_rng_state``/``set_rng_state``); ``torch.manual_seed`` seeds it too, as on a card.
* Memory: ``torch.musa.memory_allocated`` / ``max_memory_allocated`` / ``reset_peak_memory_stats``
  count the bytes of the CPU storages behind live MusaTensors (each storage once).

As on a MUSA machine, CUDA does not exist: ``torch.cuda.is_available()`` is False, ``.cuda()`` and
``device="cuda"`` raise (the CPU build's own errors), and the warnings by which ``torch.autocast("cuda")``
and ``torch.amp.GradScaler("cuda")`` switch themselves off become errors here (on a card they are
warnings and the script trains without AMP: a port that failed silently). Mixing a musa tensor with a
CPU tensor (other than a 0-dim one, which CUDA and MUSA kernels accept as a scalar) raises the
device-mismatch error a card raises.

Limits (what the wrapper cannot do, each checked in tests/migrate/test_musa_device.py):

* ``torch.Generator(device="musa")``: generators are C++ objects per backend; raises.
* ``pin_memory()`` / ``DataLoader(pin_memory=True)``: pinning needs a C++ host allocator from the backend
  hooks, which Python hooks cannot provide; the harness pins as a no-op copy (data stays on the CPU
  until ``.to("musa")``, as it does after pinning on a card).
* ``Tensor.data_ptr()`` of a MusaTensor and NumPy views of it: the wrapper has no storage of its own.
* Collectives (``mccl``), streams that run concurrently, graphs (``MUSAGraph``), ``torch.compile``: not
  simulated. Streams and events exist and are synchronous (events time with ``perf_counter``).
* Kernels are the CPU's: numerics are not a MUSA card's (FP16 matmul on the CPU, no TF32).

Use it in a child process (the backend rename cannot be undone in a process): ``python
tests/migrate/musa_device.py --record run.json -- train.py --epochs 1`` runs ``train.py`` as
``__main__`` on the simulated card and writes what it saw (see :class:`Recorder`).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import runpy
import sys
import time
import traceback
import types
import warnings
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._pytree import tree_map

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for musa_sim

import musa_sim  # noqa: E402

aten = torch.ops.aten
_STATE: dict = {}

# --- autocast op lists: upstream's CUDA lists (aten/src/ATen/autocast_mode.h), which torch_musa uses -----
LOWER = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "rms_norm", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d",
    "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa", "norm.Scalar", "norm.ScalarOpt_dim",
)
# FP32 unless the call gives a dtype (upstream's fp32_set_opt_dtype).
FP32_OPT_DTYPE = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
                  "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
                  "sum.dim_IntList")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")
BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")

# Ops that take tensors on two devices on a card too: copies, and CPU index tensors.
_CROSS_DEVICE = frozenset({"copy_", "_copy_from", "_copy_from_and_resize", "_to_copy", "index", "index_put",
                           "index_put_", "_index_put_impl_", "set_", "_has_compatible_shallow_copy_type"})


def _musa_device() -> torch.device:
    return torch.device("musa", 0)


class MusaTensor(torch.Tensor):
    """A tensor on the simulated "musa:0": a wrapper over a CPU tensor (``.inner``, never requires grad)."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        if isinstance(inner, MusaTensor):
            raise AssertionError("MusaTensor over a MusaTensor")
        if inner.requires_grad:
            inner = inner.detach()
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            layout=inner.layout, device=_musa_device(), requires_grad=False)
        r.inner = inner
        _STATE["memory"].track(inner)
        return r

    def __repr__(self, *, tensor_contents=None):  # torch's printer, on the CPU copy, with the card's device
        text = repr(self.inner)
        suffix = f", device='{self.device}'"
        if text.endswith(")"):
            extra = ", requires_grad=True" if self.requires_grad else ""
            grad_fn = f", grad_fn=<{type(self.grad_fn).__name__}>" if self.grad_fn is not None else ""
            return text[:-1] + suffix + extra + grad_fn + ")"
        return text

    __str__ = __repr__

    def tolist(self):
        return self.inner.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def __reduce_ex__(self, protocol):
        # torch.save: what a card's tensor pickles to (a plain tensor restored to its device, or to
        # torch.load's map_location), not this class: torch.load(weights_only=True) must take it.
        # A parameter (a Parameter swapped into a MusaTensor by Module.to) stays a parameter.
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter, (self.detach(), self.requires_grad, collections.OrderedDict()))
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.inner.detach().clone(), self.dtype, str(self.device), self.requires_grad))

    @classmethod
    def __torch_dispatch__(cls, func, types_, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _dispatch(func, args, kwargs):
    name = func._schema.name.split("::")[-1]
    _check_devices(func, name, args, kwargs)
    originals: dict[int, object] = {}

    def unwrap(x):
        if isinstance(x, MusaTensor):
            originals[id(x.inner)] = x
            return x.inner
        if isinstance(x, torch.Tensor):
            originals[id(x)] = x
            return x
        if isinstance(x, torch.device) and x.type == "musa":
            return torch.device("cpu")
        return x

    if func is aten._to_copy.default:
        target = kwargs.get("device")
        inner_args, inner_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        out = func(*inner_args, **inner_kwargs)
        if target is not None and target.type != "musa":
            return out  # musa -> cpu: a plain CPU tensor (-> cuda raised above: no CUDA here)
        return MusaTensor(out)
    if func is aten._pin_memory.default or func is aten.is_pinned.default:
        raise RuntimeError("cannot pin a musa tensor: only CPU memory can be pinned")
    inner_args, inner_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if "generator" in {a.name for a in func._schema.arguments} and inner_kwargs.get("generator") is None:
        positional = [a.name for a in func._schema.arguments if not a.kwarg_only]
        if "generator" not in positional[: len(inner_args)]:
            inner_kwargs["generator"] = _STATE["generator"]
    kernel = _GPU_ONLY_KERNELS.get(name)
    out = kernel(*inner_args, **inner_kwargs) if kernel else func(*inner_args, **inner_kwargs)

    def wrap(x):
        if isinstance(x, torch.Tensor):
            original = originals.get(id(x))
            if original is not None:
                return original  # in-place and out= ops return their argument
            return MusaTensor(x)
        return x

    return tree_map(wrap, out)


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``_thnn_fused_lstm_cell``: what an LSTM runs on a GPU (CUDA and MUSA have a kernel, the CPU has
    none; ``lstm_cell`` picks it for every device but the CPU). Returns (hy, cy, workspace)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_c = (torch.zeros_like(cy) if grad_cy is None else grad_cy) + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = torch.cat([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g),
                            grad_hy * tanh_cy * o * (1 - o)], 1)
    return grad_gates, grad_c * f, grad_gates.sum(0)


def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``_thnn_fused_gru_cell`` (GRU's GPU kernel, none on the CPU). Returns (hy, workspace)."""
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    i_r, i_z, i_n = input_gates.chunk(3, 1)
    h_r, h_z, h_n = hidden_gates.chunk(3, 1)
    r, z = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    hy = (1 - z) * n + z * hx
    return hy, torch.cat([r, z, n, hx, h_n], 1)


def _fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, h_n = workspace.chunk(5, 1)
    d_n = grad_hy * (1 - z) * (1 - n * n)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    d_r = d_n * h_n * r * (1 - r)
    grad_input = torch.cat([d_r, d_z, d_n], 1)
    grad_hidden = torch.cat([d_r, d_z, d_n * r], 1)
    return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)


_GPU_ONLY_KERNELS = {"_thnn_fused_lstm_cell": _fused_lstm_cell,
                     "_thnn_fused_lstm_cell_backward_impl": _fused_lstm_cell_backward,
                     "_thnn_fused_gru_cell": _fused_gru_cell,
                     "_thnn_fused_gru_cell_backward": _fused_gru_cell_backward}


def _check_devices(func, name, args, kwargs) -> None:
    """As on a card: tensors on two devices in one kernel raise (a 0-dim CPU tensor counts as a scalar)."""
    if name in _CROSS_DEVICE:
        return
    found = []
    for x in [*args, *kwargs.values()]:
        for t in (x if isinstance(x, (list, tuple)) else [x]):
            if isinstance(t, torch.Tensor) and not isinstance(t, MusaTensor):
                if t.device.type == "cpu" and t.dim() == 0:
                    continue
                found.append(t.device)
    if found:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"musa:0 and {found[0]}! (when checking argument for {func})")


class _Memory:
    """Bytes of the CPU storages behind live MusaTensors, each storage counted once."""

    def __init__(self) -> None:
        self.refs: dict[int, list] = {}  # storage key -> [wrappers alive, nbytes]
        self.allocated = 0
        self.peak = 0

    def track(self, inner: torch.Tensor) -> None:
        # The finaliser sits on the inner CPU tensor, which lives as long as its wrapper: a weakref on the
        # wrapper would stop Module.to() from swapping it into a Parameter (torch.utils.swap_tensors).
        storage = inner.untyped_storage()
        key = storage.data_ptr() or id(storage)
        entry = self.refs.get(key)
        if entry is None:
            entry = self.refs[key] = [0, storage.nbytes()]
            self.allocated += entry[1]
            self.peak = max(self.peak, self.allocated)
        entry[0] += 1
        weakref.finalize(inner, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            self.allocated -= entry[1]
            del self.refs[key]


# --- torch.musa: the sim's API, completed with what torch asks of a device module -----------------------

class Event:
    """``torch.musa.Event``: synchronous (the simulated card runs every kernel at once)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.t is None or end.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.t - self.t) * 1000.0


class Stream:
    """``torch.musa.Stream``: one queue that runs at once; ``with torch.musa.stream(s)`` works."""

    def __init__(self, device=None, priority: int = 0):
        self.device = "musa:0"

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_module(card: str):
    """The simulated ``torch.musa`` (tests/musa_sim.py's API) plus what torch and scripts ask of it."""
    m = musa_sim.make_musa_module(card)
    _, bf16_ok, _ = musa_sim.CARDS[card]
    gen = _STATE["generator"]
    mem = _STATE["memory"]
    m.is_initialized = lambda: True
    m.init = lambda: None
    m._lazy_init = lambda: None
    m._is_in_bad_fork = lambda: False
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16] if bf16_ok else [torch.float16]
    m.manual_seed = lambda seed: gen.manual_seed(int(seed))
    m.manual_seed_all = m.manual_seed
    m.seed = lambda: gen.seed()
    m.seed_all = m.seed
    m.initial_seed = lambda: gen.initial_seed()
    m.get_rng_state = lambda device="musa": gen.get_state()
    m.set_rng_state = lambda state, device="musa": gen.set_state(state)
    m.get_rng_state_all = lambda: [gen.get_state()]
    m.set_rng_state_all = lambda states: gen.set_state(states[0])
    m.memory_allocated = lambda device=None: mem.allocated
    m.max_memory_allocated = lambda device=None: mem.peak
    m.memory_reserved = lambda device=None: mem.allocated
    m.max_memory_reserved = lambda device=None: mem.peak

    def reset_peak(device=None):
        mem.peak = mem.allocated

    m.reset_peak_memory_stats = reset_peak
    m.reset_max_memory_allocated = reset_peak
    m.memory_stats = lambda device=None: {"allocated_bytes.all.current": mem.allocated,
                                          "allocated_bytes.all.peak": mem.peak}
    m.memory_summary = lambda device=None, abbreviated=False: (
        f"simulated MUSA card: {mem.allocated} bytes allocated, peak {mem.peak}")
    total = m.get_device_properties().total_memory
    m.mem_get_info = lambda device=None: (total - mem.allocated, total)
    m.Event = Event
    m.Stream = Stream
    default_stream = Stream()
    m.current_stream = lambda device=None: default_stream
    m.default_stream = lambda device=None: default_stream
    m.set_stream = lambda stream: None
    m.stream = lambda stream: stream if stream is not None else default_stream
    m.device = lambda index: _DeviceContext()
    return m


class _DeviceContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- autocast kernels for AutocastPrivateUse1 ----------------------------------------------------------

def _eligible(t) -> bool:
    return isinstance(t, MusaTensor) and t.is_floating_point() and t.dtype != torch.float64


def _autocast_kernel(op, policy):
    key = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(key):
            if policy == "lower":
                dtype = torch.get_autocast_dtype("musa")
                cast = (lambda t: t.to(dtype) if _eligible(t) else t)
            elif policy == "fp32":
                cast = (lambda t: t.float() if _eligible(t) else t)
            elif policy == "fp32_opt_dtype":
                if any(_eligible(a) for a in args):
                    names = [a.name for a in op._schema.arguments]
                    at = names.index("dtype")
                    if at < len(args):
                        if args[at] is None:
                            args = (*args[:at], torch.float32, *args[at + 1:])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            else:  # promote
                found = [t.dtype for t in tree_leaves(args) if _eligible(t)]
                widest = max(found, key=lambda d: torch.finfo(d).bits) if found else None
                cast = (lambda t: t.to(widest) if _eligible(t) and widest is not None else t)
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def tree_leaves(x):
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(x)


def _banned(*args, **kwargs):
    raise RuntimeError(BANNED_MESSAGE)


# --- registration ----------------------------------------------------------------------------------------

def install(card: str = "MTT S4000", *, strict_cuda_warnings: bool = True):
    """Make "musa" a device of this process; returns the ``torch.musa`` module. Once per process."""
    if _STATE.get("installed"):
        return torch.musa
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _STATE["generator"] = torch.Generator().manual_seed(torch.initial_seed())
    _STATE["memory"] = _Memory()
    module = make_module(card)
    _setup_privateuseone_for_python_backend("musa", backend_module=module)
    sys.modules["torch_musa"] = module  # `import torch_musa` (torch_musa < 2.1) finds it
    sys.modules["torch.musa"] = module
    torch.version.musa = "4.0.0"
    torch.backends.mudnn = types.SimpleNamespace(allow_tf32=True)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": on purpose
        warnings.simplefilter("ignore")
        # CPU tensors pin through the backend's C++ host allocator, which Python hooks cannot give:
        # pinning copies (see the limits above).
        lib.impl("_pin_memory", _pin_memory, "CPU")
        lib.impl("is_pinned", _is_pinned, "CPU")
    # torch.tensor(..., device="musa") copies with the Python key excluded: _copy_from reaches the backend.
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    auto = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", LOWER), ("fp32", FP32), ("fp32_opt_dtype", FP32_OPT_DTYPE),
                          ("promote", PROMOTE)):
        for full in names:
            base, _, overload = full.partition(".")
            op = getattr(getattr(aten, base), overload or "default")
            auto.impl(full, _autocast_kernel(op, policy), "AutocastPrivateUse1")
    auto.impl("binary_cross_entropy", _banned, "AutocastPrivateUse1")
    _STATE["libs"] = (lib, fallback, auto)
    # module.to("musa") keeps each Parameter object, as CPU -> CUDA does (there `param.data = ...`; a
    # wrapper subclass cannot take .data of a CPU tensor, so the objects are swapped): an optimizer made
    # before the move still steps the model's parameters.
    torch.__future__.set_swap_module_params_on_conversion(True)
    if strict_cuda_warnings:
        # On a MUSA card these are warnings and the script trains without AMP: a silent failure to port.
        for message in (r".*CUDA is not available.*", r".*is enabled, but CUDA is not available.*",
                        r".*User provided device_type of 'cuda', but CUDA is not available.*"):
            warnings.filterwarnings("error", message=message)
    _STATE["installed"] = True
    return module


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return MusaTensor(torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format))


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return MusaTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout))


def _copy_from(self, dst, non_blocking=False):
    src = self.inner if isinstance(self, MusaTensor) else self
    target = dst.inner if isinstance(dst, MusaTensor) else dst
    target.copy_(src)
    return dst


def _pin_memory(self, device=None):
    return self.clone()  # see the module's limits: no host allocator from Python hooks


def _is_pinned(self, device=None):
    return False


# --- what a run did ----------------------------------------------------------------------------------------

class Recorder:
    """Watches a script: optimizer steps (devices of the stepped parameters), backward() losses, the
    GradScalers made, the autocast regions entered, the warnings. ``as_dict()`` is what the record holds."""

    def __init__(self) -> None:
        self.steps = 0
        self.param_devices: set[str] = set()
        self.param_dtypes: set[str] = set()
        self.losses: list[float] = []
        self.loss_devices: set[str] = set()
        self.leaf_devices: set[str] = set()  # of the tensors a backward() accumulates gradients into
        self.scalers: list[dict] = []
        self.autocast: list[dict] = []
        self.low_precision_outputs: set[str] = set()
        self.warnings: list[str] = []
        self.error: str | None = None

    def start(self) -> None:
        rec = self

        def after_step(optimizer, args, kwargs):
            rec.steps += 1
            for group in optimizer.param_groups:
                for p in group["params"]:
                    rec.param_devices.add(p.device.type)
                    rec.param_dtypes.add(str(p.dtype).replace("torch.", ""))

        register_optimizer_step_post_hook(after_step)
        backward = torch.Tensor.backward

        def watched_backward(self, *a, **kw):
            if self.dim() == 0:
                with torch.no_grad():
                    rec.losses.append(float(self.detach().float().cpu()))
                rec.loss_devices.add(self.device.type)
            rec.leaf_devices.update(_leaf_devices(self.grad_fn))
            return backward(self, *a, **kw)

        torch.Tensor.backward = watched_backward
        scaler_init = torch.amp.GradScaler.__init__

        def watched_init(self, *a, **kw):
            scaler_init(self, *a, **kw)
            rec.scalers.append({"class": f"{type(self).__module__}.{type(self).__qualname__}",
                                "device": self._device, "enabled": self._enabled})

        torch.amp.GradScaler.__init__ = watched_init
        enter = torch.autocast.__enter__

        def watched_enter(self):
            entry = {"device_type": self.device, "dtype": str(self.fast_dtype).replace("torch.", ""),
                     "enabled": bool(self._enabled)}
            if entry not in rec.autocast:  # each kind of region once
                rec.autocast.append(entry)
            return enter(self)

        torch.autocast.__enter__ = watched_enter
        linear = torch.nn.functional.linear

        def watched_linear(*a, **kw):  # the dtype autocast gave the model's matmuls
            out = linear(*a, **kw)
            rec.low_precision_outputs.add(str(out.dtype).replace("torch.", ""))
            return out

        torch.nn.functional.linear = watched_linear
        show = warnings.showwarning

        def watched_warning(message, category, filename, lineno, file=None, line=None):
            rec.warnings.append(f"{category.__name__}: {message}")
            return show(message, category, filename, lineno, file, line)

        warnings.showwarning = watched_warning

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "param_devices": sorted(self.param_devices),
            "param_dtypes": sorted(self.param_dtypes),
            "losses": self.losses,
            "losses_finite": bool(self.losses) and all(math.isfinite(v) for v in self.losses),
            "loss_devices": sorted(self.loss_devices),
            "leaf_devices": sorted(self.leaf_devices),
            "scalers": self.scalers,
            "autocast": self.autocast,
            "linear_dtypes": sorted(self.low_precision_outputs),
            "warnings": self.warnings,
            "error": self.error,
            "musa_memory_peak": _STATE["memory"].peak if "memory" in _STATE else None,
        }


def _leaf_devices(root) -> set[str]:
    """Devices of the leaves (parameters) under a backward's graph: where the training happens, also for
    scripts that step by hand (word_language_model's ``p.data.add_(p.grad, alpha=-lr)``)."""
    found, seen, todo = set(), set(), [root] if root is not None else []
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.add(variable.device.type)
        todo.extend(n for n, _ in node.next_functions if n is not None)
    return found


def run_script(script: str, argv: list[str], record_path: str, card: str) -> int:
    install(card)
    rec = Recorder()
    rec.start()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            rec.error = f"SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - the record says what the script raised
        traceback.print_exc()
        rec.error = f"{type(exc).__name__}: {exc}"
        code = 1
    with open(record_path, "w", encoding="utf-8") as fh:
        json.dump(rec.as_dict(), fh, indent=1)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run a script on the simulated MUSA card")
    p.add_argument("--record", required=True, help="where to write the JSON record of the run")
    p.add_argument("--card", default="MTT S4000", choices=sorted(musa_sim.CARDS))
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    return run_script(a.script, args, a.record, a.card)


if __name__ == "__main__":
    sys.exit(main())
