"""Which modules add the error: one batch in FP32 and in the AMP precision from the same weights.

How: a forward + backward pass in FP32 records, for every module, the inputs of its first call and
the gradient that reached its output. Then each module is run **alone** on those FP32 inputs, once in
FP32 and once under autocast, and its output and gradients (inputs and own parameters, backpropagated
from the recorded FP32 output gradient) are compared: the relative error is what this module adds,
not what it inherited from the modules before it. A container is run with its children kept in FP32
(the FP32 regions' hooks), so that its error is that of its own ops (e.g. the attention product
written in a transformer block's ``forward``). Under FP16 the gradient fed to the low-precision pass is multiplied
by the run's loss scale (and divided back), as in training.

Inside each low-precision call a dispatch mode watches every op: an op that turns finite inputs into
inf/NaN is an **overflow** (``absorbed`` when the module's output is still finite: ``x / inf = 0``
hides it from the loss and the scaler); non-zero FP32 values that become 0 are an **underflow**.

A second pass of the whole model under autocast gives the cumulative error at every module output
(forward) and output gradient (backward), for context.

Nothing is changed: hooks are removed, gradients and buffers (BatchNorm statistics) restored, and
the RNG is re-seeded before every call so that dropout draws the same masks in both precisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ampkit.device.policy import Precision

__all__ = ["module_errors", "ModuleError", "UNDERFLOW_SHARE"]

UNDERFLOW_SHARE = 0.01  # more than 1 % of non-zero FP32 values flushed to zero is reported
_TINY = 1e-30


@dataclass
class ModuleError:
    """The error one module adds, relative to FP32 (0.01 = 1 %). ``None``: not measured (not called, no grad)."""

    module: str
    type: str
    fwd: float | None = None  # its output, run alone on FP32 inputs (its children kept in FP32)
    bwd: float | None = None  # its input and parameter gradients, from the FP32 output gradient
    added: float = 0.0  # max(fwd, bwd): the error its own ops add
    cumulative_fwd: float | None = None  # its output in the whole AMP pass
    cumulative_bwd: float | None = None  # its output's gradient in the whole AMP pass
    events: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: _json(getattr(self, k)) for k in ("module", "type", "fwd", "bwd", "added", "cumulative_fwd",
                                                     "cumulative_bwd", "events")}


def _json(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class _Watch(TorchDispatchMode):
    """Ops that make inf/NaN out of finite inputs, and where (forward / backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.hits: list[tuple[str, str, str]] = []  # (phase, op, dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if outs and any(not bool(torch.isfinite(t).all()) for t in outs):
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if all(bool(torch.isfinite(t).all()) for t in ins):
                self.hits.append((self.phase, func.overloadpacket.__name__, str(outs[0].dtype).replace("torch.", "")))
        return out


def _first_float(obj: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    if a is None or b is None or a.shape != b.shape:
        return None
    a, b = a.detach().double(), b.detach().double()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float(torch.linalg.vector_norm(a - b) / max(float(torch.linalg.vector_norm(b)), _TINY))


def _rel_many(amp: list[torch.Tensor | None], ref: list[torch.Tensor | None]) -> float | None:
    pairs = [(a, b) for a, b in zip(amp, ref) if a is not None and b is not None and a.shape == b.shape]
    if not pairs:
        return None
    if any(not bool(torch.isfinite(a).all()) for a, _ in pairs):
        return math.inf
    num = sum(float(torch.linalg.vector_norm(a.double() - b.double())) ** 2 for a, b in pairs)
    den = sum(float(torch.linalg.vector_norm(b.double())) ** 2 for _, b in pairs)
    return math.sqrt(num) / max(math.sqrt(den), _TINY)


def _flushed(amp: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """Share of the non-zero FP32 values that are exactly 0 in the low-precision result."""
    if amp is None or ref is None or amp.shape != ref.shape:
        return 0.0
    nonzero = ref != 0
    n = int(nonzero.sum())
    return float(((amp == 0) & nonzero).sum()) / n if n else 0.0


# ---------------------------------------------------------------------------------------- the FP32 record
class _Record:
    """First call of every module in an FP32 (or AMP) pass: inputs, output, output gradient."""

    def __init__(self, model: nn.Module) -> None:
        self.inputs: dict[str, tuple[tuple, dict]] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.grads: dict[str, torch.Tensor] = {}
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Callable:
        def hook(_mod, args, kwargs):
            if name not in self.inputs:
                detach = lambda t: t.detach() if isinstance(t, torch.Tensor) else t  # noqa: E731
                self.inputs[name] = (tree_map(detach, args), tree_map(detach, kwargs))
        return hook

    def _post(self, name: str) -> Callable:
        def hook(_mod, _args, out):
            first = _first_float(out)
            if first is None or name in self.outputs:
                return
            self.outputs[name] = first.detach()
            if first.requires_grad:
                first.register_hook(lambda g: self.grads.setdefault(name, g.detach()))
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _pass(model: nn.Module, loss_fn: Callable[[], torch.Tensor], precision: Precision | None, seed: int) -> _Record:
    rec = _Record(model)
    try:
        torch.manual_seed(seed)
        if precision is None:
            loss = loss_fn()
        else:
            with precision.autocast():
                loss = loss_fn()
        if loss.requires_grad and bool(torch.isfinite(loss)):
            loss.float().backward()
    finally:
        rec.remove()
        model.zero_grad(set_to_none=True)
    return rec


# ---------------------------------------------------------------------------------------- one module alone
def _leaves(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[torch.Tensor]]:
    leaves: list[torch.Tensor] = []

    def fresh(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t = t.detach().clone().requires_grad_(True)
            leaves.append(t)
        return t

    return tree_map(fresh, args), tree_map(fresh, kwargs), leaves


def _call(mod: nn.Module, inputs: tuple[tuple, dict], grad: torch.Tensor | None, seed: int, scale: float,
          ctx: Any, watch: _Watch | None) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
    args, kwargs, leaves = _leaves(*inputs)
    params = [p for p in mod.parameters() if p.requires_grad]
    torch.manual_seed(seed)
    with ctx:
        if watch is not None:
            watch.phase = "forward"
        out = _first_float(mod(*args, **kwargs))
    if out is None or grad is None or not out.requires_grad or grad.shape != out.shape:
        return out, []
    if watch is not None:
        watch.phase = "backward"
    wrt = leaves + params
    grads = torch.autograd.grad(out, wrt, grad_outputs=(grad * scale).to(out.dtype), allow_unused=True)
    return out.detach(), [None if g is None else g.detach().float() / scale for g in grads]


def _as_dtypes(ref: tuple[tuple, dict], like: tuple[tuple, dict] | None) -> tuple[tuple, dict]:
    """The FP32 input values in the dtypes the module received in the AMP pass (FP16 from a Linear before it)."""
    if like is None:
        return ref
    ref_leaves, spec = tree_flatten(ref)
    like_leaves, like_spec = tree_flatten(like)
    if spec != like_spec:
        return ref
    cast = [r.to(l.dtype) if isinstance(r, torch.Tensor) and isinstance(l, torch.Tensor) and r.is_floating_point()
            and l.is_floating_point() else r for r, l in zip(ref_leaves, like_leaves)]
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten(cast, spec)


class _ChildrenInFP32:
    """A container's children kept in FP32 (the FP32 regions' hooks), so that only its own ops run low."""

    def __init__(self, mod: nn.Module, device_type: str) -> None:
        self.mod, self.device_type, self.handle = mod, device_type, None

    def __enter__(self) -> None:
        names = [n for n, _ in self.mod.named_children()]
        if names:
            from ampkit.engine.regions import apply_fp32_regions

            self.handle = apply_fp32_regions(self.mod, names, device_type=self.device_type)

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.remove()


def _isolated(mod: nn.Module, inputs: tuple[tuple, dict], amp_inputs: tuple[tuple, dict] | None,
              grad: torch.Tensor | None, precision: Precision, seed: int, scale: float
              ) -> tuple[float | None, float | None, list[str]]:
    out32, g32 = _call(mod, inputs, grad, seed, 1.0, torch.autocast(precision.device.type, enabled=False), None)
    watch = _Watch()
    with watch, _ChildrenInFP32(mod, precision.device.type):
        outa, ga = _call(mod, _as_dtypes(inputs, amp_inputs), grad, seed, scale, precision.autocast(), watch)
    fwd = _rel(None if outa is None else outa.float(), out32)
    bwd = _rel_many(ga, g32) if g32 and ga else None
    events = []
    finite_out = outa is not None and bool(torch.isfinite(outa).all())
    for phase, op, dtype in dict.fromkeys(watch.hits):
        absorbed = phase == "forward" and finite_out
        events.append(f"overflow: {op} gave inf/NaN in {dtype} ({phase})"
                      + ("; absorbed: the module's output is finite, so neither the loss nor the scaler sees it"
                         if absorbed else ""))
    flushed = _flushed(outa, out32)
    if flushed > UNDERFLOW_SHARE:
        events.append(f"underflow: {flushed:.0%} of its non-zero FP32 outputs are 0 in {_short(precision)}")
    flushed_g = max((_flushed(a, b) for a, b in zip(ga, g32)), default=0.0) if g32 and ga else 0.0
    if flushed_g > UNDERFLOW_SHARE:
        events.append(f"underflow: {flushed_g:.0%} of its non-zero FP32 gradients are 0 in {_short(precision)}")
    return fwd, bwd, events


def _short(precision: Precision) -> str:
    return precision.name.upper()


# ---------------------------------------------------------------------------------------- the ranking
def module_errors(model: nn.Module, loss_fn: Callable[[], torch.Tensor], precision: Precision, *, seed: int = 0,
                  scale: float = 1.0) -> list[ModuleError]:
    """Every module that ran, ranked by the error it adds under ``precision`` (largest first); the root is last.

    ``loss_fn()`` runs the model on one batch and returns the loss (it is called under autocast for
    the AMP pass). ``scale``: the FP16 loss scale to apply to the low-precision backward.
    """
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    was_training = model.training
    model.train()
    try:
        ref = _pass(model, loss_fn, None, seed)
        amp = _pass(model, loss_fn, precision, seed)
        modules = dict(model.named_modules())
        errors: dict[str, ModuleError] = {}
        for name, inputs in ref.inputs.items():
            mod = modules[name]
            e = ModuleError(module=name or f"({type(mod).__name__})", type=type(mod).__name__)
            try:
                e.fwd, e.bwd, e.events = _isolated(mod, inputs, amp.inputs.get(name), ref.grads.get(name), precision,
                                                   seed, scale)
            except Exception as exc:  # noqa: BLE001 - a module that cannot run alone is reported, not fatal
                from ampkit.errors import first_line

                e.events = [f"not measured alone: {first_line(exc, 120)}"]
            e.cumulative_fwd = _rel(amp.outputs[name].float(), ref.outputs[name]) if name in amp.outputs and name in ref.outputs else None
            e.cumulative_bwd = _rel(amp.grads.get(name), ref.grads.get(name))
            errors[name] = e
        for e in errors.values():
            e.added = max((v for v in (e.fwd, e.bwd) if v is not None), default=0.0)
        root = [e for n, e in errors.items() if n == ""]
        rest = sorted((e for n, e in errors.items() if n != ""), key=lambda e: (-e.added, -(e.fwd or 0.0)))
        return rest + root
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                if k in buffers:
                    v.copy_(buffers[k])
        model.zero_grad(set_to_none=True)
        model.train(was_training)
