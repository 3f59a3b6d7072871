"""Which ops ran in which dtype: one forward and backward under autocast, every aten op recorded.

This generalises the lesson's ``assert outputs.dtype == low_dtype``: instead of one dtype at the end,
every op of the pass, with the module that ran it, its input and output dtypes, and FLOPs for the
matmul-like ops (mm, addmm, bmm, convolution, attention), which is where mixed precision pays.

>>> import torch, ampkit
>>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Softmax(-1))
>>> result = ampkit.audit(model, torch.randn(8, 16), precision="bf16")     # doctest: +SKIP
>>> result.module_category("0"), result.matmul_share                       # doctest: +SKIP
('low', 1.0)

How it works: a ``TorchDispatchMode`` sees each aten op *after* autocast has cast its inputs, so the
recorded dtypes are the ones the kernels computed in. Forward pre/post hooks keep a stack of dotted
module names to attribute ops to modules (hooks are removed afterwards; the model's ``forward`` is
never replaced). A ``TorchFunctionMode`` notes whether autocast was enabled when each torch function
was called, because inside the dispatcher autocast always looks disabled; that is how a Linear run
under ``autocast(enabled=False)`` is told apart from one fed FP64 inputs.

Categories of an op (views, detaches and allocations are not counted):

* ``low``: its floating outputs are FP16/BF16 (it computed in low precision);
* ``promoted``: it computed in FP32 although an input was low precision or derived from one by an
  autocast up-cast (e.g. ``log_softmax``/``nll_loss`` of ``cross_entropy``, on autocast's FP32 list);
* ``fp32``: FP32 in, FP32 out, nothing low precision involved (kept);
* ``fp64``: computed in FP64 (autocast never casts FP64);
* ``cast``: a dtype conversion inserted by autocast or the model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ampkit.device import Device, parse_device
from ampkit.errors import UsageError
from ampkit.device.policy import Precision, resolve_precision
from ampkit.verify.record import (BACKWARD, CATEGORIES, LOW, OUTSIDE, OpRecord, _AutocastState,  # noqa: F401
                                  _dtype_name, _first_tensor, _module_hooks, _Recorder, _SHORT, _State)

__all__ = ["audit", "audit_task", "result_from_records", "audit_from_dict", "AuditResult", "OpRecord", "Surprise", "CATEGORIES", "OUTSIDE", "BACKWARD"]

@dataclass(frozen=True)
class Surprise:
    """Something that defeats autocast, with where it happened and the fix."""

    kind: str  # "fp32-matmul-in-autocast" | "fp64" | "low-precision-params" | "other-low-dtype"
    module: str
    op: str | None
    message: str
    fix: str


@dataclass(frozen=True, kw_only=True)
class AuditResult:
    """Every recorded op plus the tables ``ampkit audit`` prints.

    ``matmul_share`` is the share of matmul-like FLOPs (forward and backward) that ran in low
    precision; ``forward_matmul_share`` the same for the forward pass alone. Both are None when the
    pass ran no matmul-like op.
    """

    precision: str
    dtype: str
    device: str
    output_dtype: str | None
    ops: tuple[OpRecord, ...]
    surprises: tuple[Surprise, ...]
    matmul_flops: int
    low_matmul_flops: int
    forward_matmul_flops: int
    forward_low_matmul_flops: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    declared: tuple[dict[str, Any], ...] = ()  # FP32 regions declared with fp32_modules: how each ran

    @property
    def matmul_share(self) -> float | None:
        return self.low_matmul_flops / self.matmul_flops if self.matmul_flops else None

    @property
    def forward_matmul_share(self) -> float | None:
        return self.forward_low_matmul_flops / self.forward_matmul_flops if self.forward_matmul_flops else None

    def by_op(self) -> list[dict[str, Any]]:
        """One row per (phase, op): how many calls fell in each category, and their FLOPs."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self.ops:
            row = rows.setdefault((r.phase, r.op), {"op": r.op, "phase": r.phase, "calls": 0, "flops": 0,
                                                    **{c: 0 for c in CATEGORIES}})
            row["calls"] += 1
            row[r.category] += 1
            row["flops"] += r.flops
        out = list(rows.values())
        for row in out:
            row["verdict"] = _dominant(row)
        return sorted(out, key=lambda r: (r["phase"] != "forward", -r["flops"], r["op"]))

    def by_module(self) -> list[dict[str, Any]]:
        """One row per module that ran forward ops itself (innermost module), in order of first use."""
        rows: dict[str, dict[str, Any]] = {}
        for r in self.ops:
            if r.phase != "forward" or r.category == "cast":
                continue
            row = rows.setdefault(r.module, {"module": r.module, "type": r.module_type, "ops": Counter(),
                                             "flops": 0, **{c: 0 for c in CATEGORIES}})
            row["ops"][f"{r.op}:{r.category}"] += 1
            row[r.category] += 1
            row["flops"] += r.flops
        out = []
        for row in rows.values():
            row["ops"] = dict(row["ops"])
            row["verdict"] = _dominant(row)
            out.append(row)
        return out

    def module_category(self, module: str) -> str | None:
        """``low`` / ``promoted`` / ``fp32`` / ``fp64`` / ``mixed`` for a module path (forward ops only)."""
        for row in self.by_module():
            if row["module"] == module:
                return row["verdict"]
        return None

    def op_categories(self, op: str, phase: str = "forward") -> set[str]:
        """The categories in which ``op`` (e.g. ``"addmm"``, ``"_softmax"``) ran."""
        return {r.category for r in self.ops if r.op == op and r.phase == phase}

    def summary(self) -> dict[str, Any]:
        """A compact version for ``compare.json`` and the report."""
        counts = Counter(r.category for r in self.ops if r.phase == "forward")
        return {
            "precision": self.precision,
            "dtype": self.dtype,
            "output_dtype": self.output_dtype,
            "matmul_share": self.matmul_share,
            "forward_matmul_share": self.forward_matmul_share,
            "matmul_flops": self.matmul_flops,
            "forward_counts": {c: counts.get(c, 0) for c in CATEGORIES},
            "by_module": self.by_module(),
            "by_op": self.by_op(),
            "surprises": [asdict(s) for s in self.surprises],
            "declared": [dict(d) for d in self.declared],
            "notes": list(self.notes),
        }

    def to_dict(self) -> dict[str, Any]:
        out = self.summary()
        out["device"] = self.device
        out["ops"] = [asdict(r) for r in self.ops]
        return out


def _dominant(row: dict[str, Any]) -> str:
    present = [c for c in ("low", "promoted", "fp32", "fp64") if row[c]]
    if not present:
        return "cast" if row.get("cast") else "-"
    return present[0] if len(present) == 1 else "mixed"


# ---------------------------------------------------------------------------------------- analysis
def _surprises(records: list[OpRecord], model: nn.Module, precision: Precision) -> list[Surprise]:
    found: list[Surprise] = []
    low_name = precision.name.upper()
    for name, mod in model.named_modules():
        low = [(pn, p.dtype) for pn, p in mod.named_parameters(recurse=False) if p.dtype in LOW]
        if low:
            dt = _dtype_name(low[0][1])
            found.append(Surprise(
                kind="low-precision-params", module=name or f"({type(mod).__name__})", op=None,
                message=f"{type(mod).__name__} '{name or type(mod).__name__}' has {len(low)} {dt} parameter(s) "
                        f"({', '.join(pn for pn, _ in low)}): the model was cast by hand (.half()/.to({dt}))",
                fix="keep the weights FP32 (remove model.half() / .to(torch.float16)) and let autocast cast; "
                    "FP32 master weights are what make small updates count",
            ))
    if not precision.autocast_enabled:
        return found
    seen: set[tuple[str, str]] = set()
    for r in records:
        if r.phase != "forward" or r.category == "cast" or r.by_rule:  # by_rule: torch's own choice (record.py)
            continue
        where = f"{r.module_type} '{r.module}'" if r.module_type else r.module
        if r.matmul and r.category in ("fp32", "fp64", "promoted") and (r.module, "mm") not in seen:
            seen.add((r.module, "mm"))
            if "float64" in r.in_dtypes:
                why, fix = ("its input is FP64, which autocast never casts",
                            "convert the inputs (and any FP64 tensors built in forward) with .float()")
            elif not r.autocast:
                why, fix = ("autocast was disabled around it (torch.autocast(..., enabled=False))",
                            "remove the disabled region if this layer is safe in low precision; keep it only "
                            "for a layer that overflows, and then on purpose")
            else:
                why, fix = ("its inputs were kept FP32 (e.g. custom_fwd(cast_inputs=torch.float32))",
                            "let autocast cast this op unless it is kept in FP32 on purpose")
            found.append(Surprise(kind="fp32-matmul-in-autocast", module=r.module, op=r.op,
                                  message=f"{where} ran {r.op} in {_SHORT.get(r.out_dtypes[0], r.out_dtypes[0])} under "
                                          f"{low_name} autocast: {why}", fix=fix))
        elif r.category == "fp64" and (r.module, "fp64") not in seen:
            seen.add((r.module, "fp64"))
            found.append(Surprise(kind="fp64", module=r.module, op=r.op,
                                  message=f"{where} computes {r.op} in FP64 under autocast (autocast never casts "
                                          f"FP64): slow, and a sign of an FP64 input or constant",
                                  fix="create tensors as float32 (torch.tensor(..., dtype=torch.float32)) or .float() them"))
        elif (r.category == "low" and r.matmul and _dtype_name(precision.dtype) not in r.out_dtypes
              and (r.module, "dtype") not in seen):
            seen.add((r.module, "dtype"))
            found.append(Surprise(kind="other-low-dtype", module=r.module, op=r.op,
                                  message=f"{where} ran {r.op} in {r.out_dtypes[0]} while autocast's dtype is "
                                          f"{_dtype_name(precision.dtype)}: a manual cast inside the model",
                                  fix="remove the manual .half()/.bfloat16() and let autocast choose the dtype"))
    return found


def _in_region(module: str, names: tuple[str, ...]) -> str | None:
    """The declared region ``module`` runs in (itself or an ancestor), or None."""
    return next((n for n in names if module == n or module.startswith(n + ".")), None)


def _declared(records: list[OpRecord], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """One entry per declared FP32 region: how its forward ops ran (they should be ``fp32``/``promoted``)."""
    out = []
    for name in names:
        ops = [r for r in records if r.phase == "forward" and r.category != "cast" and _in_region(r.module, (name,))]
        row = {c: sum(1 for r in ops if r.category == c) for c in CATEGORIES}
        ran_in = _dominant(row) if ops else "-"
        out.append({"module": name, "ops": len(ops), "ran_in": ran_in,
                    "matmul_flops": sum(r.flops for r in ops if r.matmul),
                    "message": f"'{name}' is a declared FP32 region (fp32_modules): autocast off, inputs cast to FP32; "
                               f"its {len(ops)} forward op(s) ran in {ran_in}"})
    return out


def _split_declared(found: list[Surprise], names: tuple[str, ...]) -> list[Surprise]:
    """FP32 matmuls inside a declared region are what was asked for: not surprises."""
    return [s for s in found if not (s.kind == "fp32-matmul-in-autocast" and _in_region(s.module, names))]


def _device_of(model: nn.Module, device: Device | str | None) -> Device:
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        return parse_device(device)
    for p in model.parameters():
        return parse_device(str(p.device))
    return parse_device("cpu")


def _to(obj: Any, dev: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, dev) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, dev) for k, v in obj.items()}
    return obj


def _run(model: nn.Module, forward: Callable[[], Any], loss_of: Callable[[Any], torch.Tensor | None],
         precision: Precision, *, record_loss: bool = True, fp32_modules: Any = None) -> AuditResult:
    state = _State({}, type(model).__name__)
    saved_grads = {id(p): p.grad for p in model.parameters()}
    notes: list[str] = []
    output_dtype = None
    regions = _regions(model, fp32_modules, precision)
    names = tuple(regions.names) if regions is not None else ()
    try:
        with _module_hooks(model, state), _AutocastState(state, precision.device.type), _Recorder(state):
            with precision.autocast():
                out = forward()
                first = state.root_output if state.root_output is not None else _first_tensor(out)
                output_dtype = _dtype_name(first.dtype) if first is not None else None
                state.recording = record_loss  # a default loss is ours, not the user's: not recorded
                loss = loss_of(out)
                state.recording = True
            state.phase = "backward"
            if loss is not None and loss.requires_grad:
                loss.backward()
            else:
                notes.append("no backward pass: the output does not require grad")
    finally:
        if regions is not None:
            regions.remove()
        for p in model.parameters():
            p.grad = saved_grads.get(id(p))
    return result_from_records(state.records, model, precision, output_dtype, notes, names)


def result_from_records(records: list[OpRecord], model: nn.Module, precision: Precision, output_dtype: str | None,
                        notes: list[str], names: tuple[str, ...] = ()) -> AuditResult:
    """The audit of recorded ops (``model``: where hand-cast weights are looked for; ``names``: declared FP32
    regions). Also what ``ampkit audit SCRIPT`` builds from a script's first optimizer step."""
    mm = [r for r in records if r.matmul and r.category != "cast"]
    fwd = [r for r in mm if r.phase == "forward"]
    return AuditResult(
        precision=precision.name,
        dtype=_dtype_name(precision.dtype) if precision.autocast_enabled else "float32",
        device=str(precision.device),
        output_dtype=output_dtype,
        ops=tuple(records),
        surprises=tuple(_split_declared(_surprises(records, model, precision), names)),
        matmul_flops=sum(r.flops for r in mm),
        low_matmul_flops=sum(r.flops for r in mm if r.category == "low"),
        forward_matmul_flops=sum(r.flops for r in fwd),
        forward_low_matmul_flops=sum(r.flops for r in fwd if r.category == "low"),
        notes=tuple(notes),
        declared=tuple(_declared(records, names)),
    )


def audit_from_dict(d: dict[str, Any]) -> AuditResult:
    """An :class:`AuditResult` back from its ``to_dict()`` (the audit of a script comes from its own process)."""
    ops = tuple(OpRecord(**{k: tuple(v) if isinstance(v, list) else v for k, v in o.items()}) for o in d["ops"])
    mm = [r for r in ops if r.matmul and r.category != "cast"]
    fwd = [r for r in mm if r.phase == "forward"]
    return AuditResult(precision=d["precision"], dtype=d["dtype"], device=d["device"], output_dtype=d["output_dtype"],
                       ops=ops, surprises=tuple(Surprise(**x) for x in d["surprises"]),
                       matmul_flops=sum(r.flops for r in mm), low_matmul_flops=sum(r.flops for r in mm if r.category == "low"),
                       forward_matmul_flops=sum(r.flops for r in fwd),
                       forward_low_matmul_flops=sum(r.flops for r in fwd if r.category == "low"),
                       notes=tuple(d["notes"]), declared=tuple(d["declared"]))


def _regions(model: nn.Module, fp32_modules: Any, precision: Precision) -> Any:
    """The FP32 regions' hooks on ``model`` for the audited pass (None without ``fp32_modules``)."""
    if not fp32_modules:
        return None
    from ampkit.engine.regions import apply_fp32_regions

    return apply_fp32_regions(model, fp32_modules, device_type=precision.device.type)


def _resolve(precision: Precision | str, device: Device) -> Precision:
    if isinstance(precision, Precision):
        return precision
    return resolve_precision(precision, device)


def audit(model: nn.Module, example_inputs: Any, *, precision: Precision | str = "auto",
          loss_fn: Callable[[Any], torch.Tensor] | None = None, device: Device | str | None = None,
          fp32_modules: Any = None) -> AuditResult:
    """Run ``model`` once forward and backward under autocast and record the dtype of every op.

    Args:
        model: any ``nn.Module``; it is not modified (hooks are removed, gradients restored).
        example_inputs: a tensor, a tuple/list of positional inputs, or a dict of keyword inputs;
            moved to the model's device.
        precision: ``"auto" | "bf16" | "fp16" | "fp32"`` or a resolved :class:`~ampkit.device.policy.Precision`.
        loss_fn: ``loss_fn(output) -> scalar`` run under autocast, as in training. Default: the sum of
            the output (computed in FP32 and not recorded), only to drive the backward pass.
        device: where to run (default: where the model's parameters are).
        fp32_modules: FP32 regions declared as in training (names, globs, types, ``"preset:norm"``; see
            :mod:`ampkit.engine.regions`): they are reported in ``declared``, not as surprises.

    >>> r = audit(torch.nn.Linear(4, 4), torch.randn(2, 4), precision="bf16")   # doctest: +SKIP
    >>> r.output_dtype                                                          # doctest: +SKIP
    'bfloat16'
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"audit() needs an nn.Module, got {type(model).__name__}")
    dev = _device_of(model, device)
    prec = _resolve(precision, dev)
    inputs = _to(example_inputs, dev.torch_device)
    if isinstance(inputs, dict):
        forward = lambda: model(**inputs)  # noqa: E731
    elif isinstance(inputs, (tuple, list)):
        forward = lambda: model(*inputs)  # noqa: E731
    else:
        forward = lambda: model(inputs)  # noqa: E731

    def default_loss(out: Any) -> torch.Tensor | None:
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return sum(t.float().sum() for t in tensors) if tensors else None

    return _run(model, forward, loss_fn or default_loss, prec, record_loss=loss_fn is not None,
                fp32_modules=fp32_modules)


def audit_task(task: Any, *, precision: Precision | str = "auto", device: Device | str | None = None,
               fp32_modules: Any = None) -> AuditResult:
    """Audit ``task.loss(model, batch)`` on the task's first batch, forward and backward (``ampkit audit --task``).

    ``fp32_modules``: the run's FP32 regions (see :func:`audit`), reported as declared, not as surprises.
    """
    from ampkit.device import detect_device
    from ampkit.training.trainer import batch_to

    dev = device if isinstance(device, Device) else detect_device(device)
    prec = _resolve(precision, dev)
    model = task.model.to(prec.device.torch_device)
    batch = batch_to(task.batch(0), prec.device)
    was_training = model.training
    model.train()
    try:
        return _run(model, lambda: task.loss(model, batch), lambda loss: loss, prec, fp32_modules=fp32_modules)
    finally:
        model.train(was_training)
