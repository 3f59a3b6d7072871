"""FP16 range analysis: run a few steps in FP32, record per module how large and how small the
activations and gradients are, and predict what FP16 would do with them.

Only values the AMP run holds in FP16 can overflow it: autocast keeps some ops in FP32 (softmax, norms,
losses, exp) and type promotion makes others FP32 (an FP16 tensor times an FP32 one). The op watch
follows autocast's own casting rules through the FP32 run (:mod:`~ampkit.diagnose.amp_dtypes`), and a
module output or op output that would be FP32 is never named as an FP16 overflow.

FP16's largest finite value is 65504; values below 2^-14 become subnormal (fewer significant bits)
and values below 2^-24 flush to zero. Gradients are multiplied by the loss scale, so the report
predicts overflow and underflow at scale 1 and at the recommended initial scale.

Magnitudes are kept on the device as power-of-two histograms (no host read per step) and read
once when the report is built.

>>> report = fp16_range_report(model, [(x, y)], torch.nn.functional.cross_entropy)  # doctest: +SKIP
>>> report.keep_fp32, report.recommended_scale                                        # doctest: +SKIP
(('model.2',), 4096.0)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable, Iterable

import torch

from ampkit.diagnose.opwatch import OpWatch
from ampkit.diagnose.tracking import ModuleTracker, UserCode, tensor_leaves

__all__ = ["fp16_range_report", "RangeReport", "ModuleRange", "OpRange", "RangeRecorder", "recommended_scale",
           "FP16_MAX", "FP16_MIN_NORMAL_EXP", "FP16_MIN_SUBNORMAL_EXP"]

FP16_MAX = 65504.0
FP16_MIN_NORMAL_EXP = -14    # 2^-14: smallest normal FP16 value
FP16_MIN_SUBNORMAL_EXP = -24  # 2^-24: smallest subnormal; below it values flush to zero
_LO, _BINS = -160, 300          # histogram of floor(log2|x|) from 2^-160 (bin 0 also holds zeros)
_MAX_SCALE_EXP = 16             # GradScaler's default initial scale is 2^16
_HEADROOM = 2.0                 # keep the largest scaled gradient at most half of FP16's max


@dataclass(frozen=True, kw_only=True)
class ModuleRange:
    """Magnitudes seen for one module (``param`` rows: one parameter's gradient) and what FP16 would do."""

    name: str
    kind: str                       # "module" or "param"
    type: str                       # module class name ("" for params)
    act_max: float | None           # max |output| (None for params)
    input_max: float | None
    grad_max: float | None          # max |gradient| of the output (module) or of the parameter
    grad_zero_share_fp16: float | None      # share of non-zero FP32 grad elements FP16 flushes to 0, scale 1
    grad_subnormal_share_fp16: float | None  # ... that land in FP16 subnormals, scale 1
    grad_zero_share_scaled: float | None    # ... flushed to 0 at the recommended scale
    overflow_forward: bool
    overflow_backward_scaled: bool  # the gradient overflows at the recommended scale


@dataclass(frozen=True, kw_only=True)
class OpRange:
    """An aten op inside ``module`` whose FP32 output exceeds FP16's max (``max``); when the module's own
    output stays below it (``module_output_max``), FP16 would overflow there and the module absorb it."""

    module: str
    op: str
    max: float
    module_output_max: float | None

    @property
    def absorbed(self) -> bool:
        return self.module_output_max is not None and self.module_output_max <= FP16_MAX


@dataclass(frozen=True, kw_only=True)
class RangeReport:
    """What FP16 would do to the recorded run; ``keep_fp32`` names the modules where an overflow starts."""

    modules: tuple[ModuleRange, ...]
    recommended_scale: float
    keep_fp32: tuple[str, ...]
    overflow: tuple[str, ...]         # every module whose output exceeds 65504
    underflow: tuple[str, ...]        # modules/params with >= 50 % of gradient elements flushed to 0 at scale 1
    steps: int
    notes: tuple[str, ...] = ()
    op_overflow: tuple[OpRange, ...] = ()  # ops inside modules whose output exceeds 65504
    fp32_modules: tuple[str, ...] = ()     # keep_fp32 as names inside the model (for --fp32-modules)

    def to_dict(self) -> dict:
        return asdict(self)


class _Acc:
    __slots__ = ("type", "act_max", "act_low", "in_max", "grad_max", "grad_hist")

    def __init__(self, type_name: str) -> None:
        self.type = type_name
        self.act_max = self.act_low = self.in_max = self.grad_max = self.grad_hist = None


def _amax(ts: list[torch.Tensor], dev: torch.device) -> torch.Tensor:
    return torch.stack([t.detach().abs().amax().float().to(dev) if t.numel() else
                        torch.zeros((), device=dev) for t in ts]).amax()


def _hist(t: torch.Tensor) -> torch.Tensor:
    a = t.detach().abs().float().flatten()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    e = torch.where(a > 0, torch.floor(torch.log2(a)), torch.full_like(a, _LO)).clamp(_LO, _LO + _BINS - 1)
    idx = (e - _LO).long()
    return torch.zeros(_BINS, dtype=torch.int64, device=t.device).scatter_add_(0, idx, torch.ones_like(idx))


def _mx(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.maximum(a, b.to(a.device))  # NaN propagates: a NaN is reported as such


def _fmax(values) -> float | None:
    """Largest value ignoring NaN (inf counts: it is an overflow); None when there is none."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return max(vals) if vals else (float("nan") if any(v is not None for v in values) else None)


class RangeRecorder:
    """Accumulates magnitudes per step and module path on the device; :meth:`report` reads them once."""

    def __init__(self, tracker: ModuleTracker, is_low: Callable[[torch.Tensor], bool] | None = None) -> None:
        self.tracker = tracker
        # whether the AMP run holds a value in FP16 (autocast's rules, :class:`~ampkit.diagnose.amp_dtypes.AmpDtypes`);
        # None: every output counts
        self.is_low = is_low
        self._acc: dict[tuple[int, str, str], _Acc] = {}  # (step, kind, name)
        self._ops: dict[tuple[int, str, str], torch.Tensor] = {}  # (step, module, op) -> max |output|
        self.steps = 0
        self.closed = False
        self.fp32_calls: set[str] = set()  # modules called on explicitly FP32 inputs (see record)

    def close(self) -> None:
        """The run stops before the current step's optimizer step: drop that step's partial records."""
        self.closed = True
        for key in [k for k in self._acc if k[0] >= self.steps]:
            del self._acc[key]

    def record_ops(self, maxima: dict[tuple[str, str], torch.Tensor]) -> None:
        """The op watch's largest op outputs per (module, op) for the current step."""
        if self.closed:
            return
        for (module, op), m in maxima.items():
            self._ops[(self.steps, module, op)] = m

    def _get(self, kind: str, name: str, type_name: str) -> _Acc:
        key = (self.steps, kind, name)
        acc = self._acc.get(key)
        if acc is None:
            acc = self._acc[key] = _Acc(type_name)
        return acc

    def record(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any, fp32: bool = False) -> None:
        """One module call; ``fp32``: the AMP run computes this call in FP32 too (a loss on ``x.float()``),
        so FP16's range does not apply to it or to its submodules."""
        outs = tensor_leaves(output)
        if not outs or self.closed:
            return
        if fp32:
            self.fp32_calls.add(self.tracker.name(module))
        dev = outs[0].device
        acc = self._get("module", self.tracker.name(module), type(module).__name__)
        with torch.no_grad():
            acc.act_max = _mx(acc.act_max, _amax(outs, dev))
            low = [t for t in outs if self.is_low is None or self.is_low(t)]
            if low:  # an output autocast keeps in FP32 (a norm, a softmax, a promoted sum) cannot overflow FP16
                acc.act_low = _mx(acc.act_low, _amax(low, dev))
            ins = tensor_leaves((args, kwargs))
            if ins:
                acc.in_max = _mx(acc.in_max, _amax(ins, dev))
        if torch.is_grad_enabled():
            for t in outs:
                if t.requires_grad:
                    t.register_hook(partial(self._grad, acc))

    @staticmethod
    def _grad(acc: _Acc, grad: torch.Tensor) -> None:
        if grad is None or not grad.is_floating_point():
            return
        with torch.no_grad():
            acc.grad_max = _mx(acc.grad_max, grad.detach().abs().amax().float())
            h = _hist(grad)
            acc.grad_hist = h if acc.grad_hist is None else acc.grad_hist + h.to(acc.grad_hist.device)

    def record_params(self, params: Iterable[torch.Tensor]) -> None:
        """Parameter gradients at an optimizer step (FP16 autocast computes weight gradients in FP16)."""
        if self.closed:
            return
        for p in params:
            if p.grad is None or not p.grad.is_floating_point():
                continue
            self._grad(self._get("param", self.tracker.param_name(p), ""), p.grad)
        self.steps += 1

    # ------------------------------------------------------------------ the report
    def _counted(self, name: str) -> bool:
        """FP16's range applies: not a module (or inside one) the AMP run computes in FP32 anyway."""
        return not any(name == n or name.startswith(n + ".") for n in self.fp32_calls)

    def report(self) -> RangeReport:
        def f(t):
            return None if t is None else float(t.cpu())

        # Read everything once; keep first-seen order of (kind, name).
        per_step: dict[int, dict[tuple[str, str], tuple]] = {}
        order: dict[tuple[str, str], str] = {}
        for (step, kind, name), a in self._acc.items():
            order.setdefault((kind, name), a.type)
            hist = None if a.grad_hist is None else a.grad_hist.cpu().tolist()
            per_step.setdefault(step, {})[(kind, name)] = (f(a.act_max), f(a.in_max), f(a.grad_max), hist, f(a.act_low))
        # Where an overflow starts: in the first step that has one. Later steps of the FP32 run may have
        # diverged because of it (an FP16 run with a scaler would have skipped those updates), so the
        # statistics below use the steps up to that one.
        keep: tuple[str, ...] = ()
        notes = []
        used = sorted(per_step)
        ops: dict[int, list[tuple[str, str, float]]] = {}
        for (step, module, op), m in self._ops.items():
            ops.setdefault(step, []).append((module, op, float(m.cpu())))
        for step in ops:
            per_step.setdefault(step, {})
        for step in sorted(per_step):
            origins = [name for (kind, name), v in per_step[step].items()
                       if kind == "module" and v[4] is not None and v[4] > FP16_MAX
                       and (v[1] is None or v[1] <= FP16_MAX) and self._counted(name)]
            # An op inside a module overflows although the module's input fits FP16 (absorbed or not).
            for module, op, m in ops.get(step, []):
                inp = per_step[step].get(("module", module), (None, None))[1]
                if m > FP16_MAX and (inp is None or inp <= FP16_MAX) and module not in origins and self._counted(module):
                    origins.append(module)
            if origins:
                keep = tuple(n for n in origins if not any(o != n and o.startswith(n + ".") for o in origins))
                used = [k for k in used if k <= step]
                if len(used) < len(per_step):
                    notes.append(f"the first FP16 overflow appears at step {step}: statistics use steps 0-{step}")
                break
        merged: dict[tuple[str, str], tuple] = {}
        for key in order:
            vals = [per_step[k][key] for k in used if key in per_step[k]]
            hists = [v[3] for v in vals if v[3] is not None]
            hist = [sum(col) for col in zip(*hists)] if hists else None
            merged[key] = (_fmax([v[0] for v in vals]), _fmax([v[1] for v in vals]), _fmax([v[2] for v in vals]), hist,
                           _fmax([v[4] for v in vals]))
        gmax = max((v[2] for v in merged.values() if v[2] is not None and math.isfinite(v[2])), default=0.0)
        scale = recommended_scale(gmax)
        scale_exp = round(math.log2(scale))
        rows: list[ModuleRange] = []
        for (kind, name), type_name in order.items():
            if (kind, name) not in merged or all(v is None for v in merged[(kind, name)]):
                continue
            act, inp, g, h, act_low = merged[(kind, name)]
            rows.append(ModuleRange(
                name=name, kind=kind, type=type_name, act_max=act, input_max=inp, grad_max=g,
                grad_zero_share_fp16=_share(h, FP16_MIN_SUBNORMAL_EXP - 1, 0),
                grad_subnormal_share_fp16=_share(h, FP16_MIN_NORMAL_EXP - 1, 0),
                grad_zero_share_scaled=_share(h, FP16_MIN_SUBNORMAL_EXP - 1, scale_exp),
                overflow_forward=act_low is not None and act_low > FP16_MAX,
                overflow_backward_scaled=g is not None and g * scale > FP16_MAX,
            ))
        overflow = tuple(r.name for r in rows if r.overflow_forward and self._counted(r.name))
        under = tuple(r.name for r in rows if (r.grad_zero_share_fp16 or 0) >= 0.5)
        if scale_exp < 0:
            notes.append(f"gradients reach {gmax:.3g}: even scale 1 overflows FP16; keep the named modules in FP32 "
                         "or lower the loss magnitude")
        if any(v[0] is not None and not math.isfinite(v[0]) for k in used for v in per_step[k].values()):
            notes.append("the FP32 run itself produced inf/NaN: magnitudes after that point are not meaningful")
        if not rows:
            notes.append("no module ran: nothing recorded")
        for name in sorted(self.fp32_calls):
            notes.append(f"{name} runs on inputs the script casts with `.float()`: FP32 in the AMP run too, not counted")
        op_rows: dict[tuple[str, str], float] = {}
        for step in used:
            for module, op, m in ops.get(step, []):
                if m > FP16_MAX and self._counted(module):
                    op_rows[(module, op)] = _fmax([op_rows.get((module, op)), m])
        op_overflow = tuple(OpRange(module=mod, op=op, max=m, module_output_max=merged.get(("module", mod), (None,))[0])
                            for (mod, op), m in op_rows.items())
        return RangeReport(modules=tuple(rows), recommended_scale=scale, keep_fp32=keep, overflow=overflow,
                           underflow=under, steps=self.steps, notes=tuple(notes), op_overflow=op_overflow,
                           fp32_modules=tuple(self.tracker.relative(n) for n in keep))


def recommended_scale(gmax: float) -> float:
    """The initial FP16 loss scale for gradients up to ``gmax``: the largest power of two that keeps
    ``gmax * scale`` at most half of FP16's max, capped at GradScaler's default 2^16."""
    if not gmax > 0 or not math.isfinite(gmax):
        return 2.0 ** _MAX_SCALE_EXP
    return 2.0 ** min(_MAX_SCALE_EXP, math.floor(math.log2(FP16_MAX / _HEADROOM / gmax)))


def _share(hist: list[int] | None, max_exp: int, scale_exp: int) -> float | None:
    """Share of non-zero elements with floor(log2|g|) + scale_exp <= max_exp."""
    if hist is None:
        return None
    nonzero = sum(hist[1:])
    if nonzero == 0:
        return 0.0
    cut = max_exp - scale_exp - _LO  # last bin index that is below the threshold
    return sum(hist[1:max(1, min(_BINS, cut + 1))]) / nonzero


def fp16_range_report(model: torch.nn.Module, batches: Iterable[Any],
                      loss_fn: Callable[[Any, Any], torch.Tensor], *, steps: int | None = None,
                      name: str = "model") -> RangeReport:
    """Run ``loss_fn(model(x), y)`` and backward for each ``(x, y)`` in ``batches`` (at most ``steps``)
    in FP32 (autocast off), and predict which activations and gradients FP16 would overflow or flush.

    Gradients are left zeroed (``set_to_none``) and no optimizer step is taken: the model is unchanged.

    >>> r = fp16_range_report(net, [(torch.randn(8, 4), torch.randn(8, 2))], torch.nn.functional.mse_loss)  # doctest: +SKIP
    >>> r.keep_fp32                                                                                            # doctest: +SKIP
    ('model.2',)
    """
    tracker = ModuleTracker(UserCode("/nonexistent-ampkit"))
    tracker.add_root(model, name)
    busy = [0]  # our own ops inside the hooks are not the model's
    watch = OpWatch("range", tracker.name, lambda: busy[0] > 0)
    rec = RangeRecorder(tracker, watch.amp.is_low)

    def pre(m, a):
        watch.push(m)

    def post(m, a, kw, o):
        watch.pop()
        busy[0] += 1
        try:
            rec.record(m, a, kw, o)
        finally:
            busy[0] -= 1

    mm = torch.nn.modules.module
    handles = [mm.register_module_forward_pre_hook(pre),
               mm.register_module_forward_hook(post, with_kwargs=True)]
    try:
        model.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(batches):
            if steps is not None and i >= steps:
                break
            dev = next((p.device.type for p in model.parameters()), "cpu")
            with torch.autocast(dev, enabled=False) if _has_autocast(dev) else contextlib.nullcontext():
                with watch:
                    out = model(x)
                watch.stack.clear()
                loss = loss_fn(out, y)
            loss.backward()
            rec.record_ops(watch.take_maxima())
            rec.record_params(model.parameters())
            model.zero_grad(set_to_none=True)
    finally:
        for h in handles:
            h.remove()
    return rec.report()


def _has_autocast(dev: str) -> bool:
    try:
        return bool(torch.amp.is_autocast_available(dev))
    except RuntimeError:  # a device string torch does not know
        return False
