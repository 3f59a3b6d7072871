"""The per-op comparison: a dispatch mode that replays every op of the script on the reference device.

Each aten op the script runs (forward and backward) goes through :class:`ParityMode`: the op runs as the script
asked, on its device; then, with every dispatch mode switched off (so the replay reaches the plain kernels),
the same op runs on copies of the same inputs, in FP64, on the reference device, and the two results are judged by
:mod:`ampkit.parity.bounds`. Inputs are the device's own values, so a difference is the op's own, not one carried
in from an earlier op.

Not replayed: ops that draw random numbers (dropout, ``rand``), that allocate without values (``empty``), views and
metadata, and the optimizer's fused or multi-tensor updates (``_foreach_*``, ``_fused_*``): parity covers the
forward and the backward. An op the reference device has no kernel for is counted as not replayable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from ampkit.diagnose.oplocate import created_at
from ampkit.diagnose.tracking import UserCode
from ampkit.parity.bounds import excess, magnitude_args, reference_args

__all__ = ["OpResult", "ParityMode", "ModulePaths"]

_SKIP_WORDS = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform", "exponential", "empty",
               "_foreach", "_fused", "_local_scalar_dense", "copy_", "set_", "detach", "alias", "lift_fresh",
               "_to_dense", "resize", "zero_", "fill_", "record_stream", "_assert", "sym_", "is_same_size", "item")


@dataclass
class OpResult:
    """One op whose result was off: where and by how much."""

    index: int
    op: str
    where: str
    module: str
    phase: str  # "forward" or "backward"
    dtypes: tuple[str, ...]
    out_dtype: str
    ratio: float  # max |device - reference| / bound; above 1 is a difference
    max_error: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ModulePaths:
    """The dotted path of the module running now (global forward hooks; the first module run is the root)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self._names: dict[int, str] = {}
        self._handles: list[Any] = []

    def install(self) -> None:
        mm = torch.nn.modules.module
        self._handles = [mm.register_module_forward_pre_hook(self._enter),
                         mm.register_module_forward_hook(self._leave, always_call=True)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        if not self.stack and id(module) not in self._names:
            for name, sub in module.named_modules():
                self._names.setdefault(id(sub), name or "model")
        name = self._names.get(id(module), type(module).__name__)
        self.stack.append(name if name else "model")

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop()

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else "(no module)"


# The accelerators' fused attention kernels have no CPU kernel of the same name: their forward output is compared
# with torch's math attention in FP64 (positions of (attn_bias, dropout_p, is_causal) in each op's arguments).
FUSED_SDPA = {"_scaled_dot_product_flash_attention": (None, 3, 4),
              "_scaled_dot_product_efficient_attention": (3, 5, 6),
              "_scaled_dot_product_cudnn_attention": (3, 5, 6)}


def sdpa_reference(name: str, args: tuple, kwargs: dict, device: torch.device) -> torch.Tensor | None:
    """The FP64 math-attention output for a fused attention op's arguments; None when it draws dropout."""
    bias_at, dropout_at, causal_at = FUSED_SDPA[name]

    def arg(i: int | None, key: str, default: Any) -> Any:
        if i is not None and len(args) > i:
            return args[i]
        return kwargs.get(key, default)

    if float(arg(dropout_at, "dropout_p", 0.0) or 0.0) > 0:
        return None
    q, k, v = (reference_args(a, device) for a in args[:3])
    bias = arg(bias_at, "attn_bias", None)
    bias = reference_args(bias, device) if isinstance(bias, torch.Tensor) else None
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, bias, 0.0, bool(arg(causal_at, "is_causal", False)), None, scale=kwargs.get("scale"))[0]


def _base(func: Any) -> str:
    return func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)


def _floats(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


@dataclass
class ParityMode(TorchDispatchMode):
    """Replays each op on ``reference`` in FP64 and keeps the ops whose result is off beyond its bound."""

    reference: torch.device
    user: UserCode
    modules: ModulePaths
    limit: int = 50  # ops kept beyond the first
    paused: bool = False  # during the optimizer's step: parity covers the forward and the backward
    checked: int = 0
    skipped: int = 0
    not_replayable: dict[str, str] = field(default_factory=dict)
    off: list[OpResult] = field(default_factory=list)
    worst: float = 0.0
    replay_s: float = 0.0
    _index: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _base(func)
        mutable = func._schema.is_mutable
        if self.paused or any(w in name for w in _SKIP_WORDS) or (mutable and not name.endswith("_")):  # out= variants too
            self.skipped += 1
            return func(*args, **kwargs)
        inputs = _floats((args, kwargs))
        before = (tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), kwargs) if mutable else None
        out = func(*args, **kwargs)
        outs = _floats(out)
        storages = {_storage(i) for i in inputs}
        if not inputs or not outs or any(_storage(o) in storages for o in outs) and not mutable:
            self.skipped += 1  # a view, a factory or an op with no floating-point values to judge
            return out
        self._index += 1
        t0 = time.perf_counter()
        try:
            self._judge(func, name, before or (args, kwargs), outs)
        finally:
            self.replay_s += time.perf_counter() - t0
        return out

    def _judge(self, func, name: str, call: tuple, outs: list[torch.Tensor]) -> None:
        args, kwargs = call
        with _disable_current_modes(), torch.no_grad():
            try:
                if name in FUSED_SDPA:
                    ref = sdpa_reference(name, args, kwargs, self.reference)
                    if ref is None:
                        return
                    outs = outs[:1]  # the attention output (the log-sum-exp and seeds are the kernel's own)
                else:
                    ref = func(*reference_args(args, self.reference), **reference_args(kwargs, self.reference))
                magnitude = None
                mags = magnitude_args(name, reference_args(args, self.reference), reference_args(kwargs, self.reference))
                if mags is not None:
                    op = func
                    if name.rstrip("_") in ("sub", "rsub"):  # |a| + |alpha| |b|: the terms' magnitudes
                        op = torch.ops.aten.add.Tensor if isinstance(mags[0][1], torch.Tensor) else torch.ops.aten.add.Scalar
                    magnitude = op(*mags[0], **mags[1])
            except Exception as exc:  # noqa: BLE001 - a kernel the reference lacks: counted, not judged
                self.not_replayable.setdefault(name, str(exc).strip().splitlines()[0][:120] if str(exc).strip()
                                               else type(exc).__name__)
                return
            refs = _floats(ref)
            mags = _floats(magnitude) if magnitude is not None else [None] * len(refs)
            if len(refs) != len(outs):
                return
            self.checked += 1
            on_cpu = outs[0].device.type == "cpu"
            ratio, err = 0.0, 0.0
            for o, r, m in zip(outs, refs, mags):
                if o.shape != r.shape:
                    continue
                q, e = excess(name, o, r, m if m is not None and m.shape == r.shape else None, args, on_cpu)
                if q > ratio:
                    ratio, err = q, e
        self.worst = max(self.worst, ratio)
        if ratio > 1.0 and len(self.off) <= self.limit:
            self.off.append(self._result(name, args, kwargs, outs, ratio, err))

    def _result(self, name: str, args: tuple, kwargs: dict, outs: list[torch.Tensor], ratio: float,
                err: float) -> OpResult:
        node = torch._C._current_autograd_node()
        phase = "backward" if node is not None else "forward"
        where = self.user.where(3)
        module = self.modules.current
        if node is not None:
            where, module = created_at(node, self.user) or where, f"backward of {node.name()}"
        dtypes = tuple(str(t.dtype).replace("torch.", "") for t in _floats((args, kwargs)))
        return OpResult(index=self._index, op=f"aten.{name}", where=where, module=module, phase=phase,
                        dtypes=dtypes, out_dtype=str(outs[0].dtype).replace("torch.", ""), ratio=ratio, max_error=err)


