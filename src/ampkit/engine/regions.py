"""FP32 regions: named modules that run with autocast off and FP32 inputs, declared, not patched in.

>>> regions = apply_fp32_regions(model, ["*.norm", "preset:loss"], device_type="cpu")   # doctest: +SKIP
>>> regions.names                                                                     # doctest: +SKIP
('blocks.0.norm', 'blocks.1.norm', 'loss_fn')
>>> regions.remove()            # every hook gone: the model behaves exactly as before   # doctest: +SKIP

A spec is a qualified module name (``"blocks.0.norm"``), a glob over qualified names (``"*.norm"``,
``"blocks.*.attn"``), a module type (``nn.LayerNorm``) or a preset (``"preset:norm"``,
``"preset:softmax"`` / ``"preset:attention"``, ``"preset:loss"``; see :data:`PRESETS`). Wrapper
prefixes (``_orig_mod.`` from ``torch.compile``, ``module.`` from DDP) are stripped before matching,
so the names are the ones the user's own model has.

Why hooks and not a wrapper: the design forbids replacing a user's ``forward`` (pickling, saved
models that carry the wrapper, outputs in the wrong dtype). A forward pre-hook turns autocast off and
casts the module's FP16/BF16 floating inputs (args and kwargs, nested in lists, tuples and dicts) to
FP32; a forward hook registered with ``always_call=True`` turns autocast back on, also when the
forward raises. A matched module inside a matched module does not enter the region twice.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ampkit.errors import UsageError

__all__ = ["FP32Regions", "PRESETS", "apply_fp32_regions", "normalize_fp32_modules", "strip_wrapper_prefixes"]

_LOW = (torch.float16, torch.bfloat16)
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]+$")
# Heuristic name parts for the attention preset (last component of the qualified name).
_ATTENTION_NAMES = frozenset({"attn", "attention", "self_attn", "self_attention", "cross_attn", "softmax"})


def _norm_types() -> tuple[type, ...]:
    types: list[type] = [nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
                         nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm]
    rms = getattr(nn, "RMSNorm", None)  # torch >= 2.4
    if rms is not None:
        types.append(rms)
    return tuple(types)


def _is_norm(name: str, module: nn.Module) -> bool:
    # Hand-written normalisations (LlamaRMSNorm, T5LayerNorm, ScaledNorm) are caught by class name.
    return isinstance(module, _norm_types()) or type(module).__name__.lower().endswith("norm")


def _is_attention(name: str, module: nn.Module) -> bool:
    if isinstance(module, (nn.MultiheadAttention, nn.Softmax, nn.Softmin, nn.LogSoftmax)):
        return True
    cls = type(module).__name__.lower()
    if "attention" in cls or "softmax" in cls:
        return True
    return name.rsplit(".", 1)[-1].lower() in _ATTENTION_NAMES


def _is_loss(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.modules.loss._Loss)


@dataclass(frozen=True)
class _Preset:
    description: str
    match: Callable[[str, nn.Module], bool]


#: The presets, by name. Each takes ``(qualified_name, module)`` and says whether it matches.
PRESETS: dict[str, _Preset] = {
    "norm": _Preset("normalisation layers: LayerNorm, GroupNorm, BatchNorm*, InstanceNorm*, RMSNorm, "
                    "LocalResponseNorm, and any class whose name ends in 'Norm'", _is_norm),
    "softmax": _Preset("softmax / attention scores: MultiheadAttention, Softmax, Softmin, LogSoftmax, any class "
                       "whose name contains 'Attention' or 'Softmax', and modules named attn, attention, "
                       "self_attn, self_attention, cross_attn or softmax", _is_attention),
    "loss": _Preset("loss modules (subclasses of torch.nn.modules.loss._Loss)", _is_loss),
}
PRESETS["attention"] = PRESETS["softmax"]

Spec = str | type


def _bad(value: Any, why: str) -> UsageError:
    return UsageError(f"fp32_modules: {why} (got {value!r}); give module names, globs such as '*.norm', "
                      f"module types, or presets ({', '.join('preset:' + p for p in PRESETS)})")


def _string_specs(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise _bad(text, "empty name in the list")
        if part.startswith("preset:"):
            preset = part[len("preset:"):].strip().lower()
            if preset not in PRESETS:
                raise UsageError(f"fp32_modules: unknown preset {preset!r}: use one of "
                                 f"{', '.join('preset:' + p for p in PRESETS)}")
            out.append(f"preset:{preset}")
        elif not _NAME_RE.match(part) or part.startswith(".") or part.endswith(".") or ".." in part:
            raise _bad(part, "not a dotted module name or glob")
        else:
            out.append(part)
    return out


def normalize_fp32_modules(value: Any) -> tuple[Spec, ...]:
    """Validate and flatten an ``fp32_modules`` value into a tuple of specs (duplicates dropped, order kept).

    Accepts None (no regions), a string (``"a.b"``, ``"*.norm"``, ``"preset:norm"`` or a
    comma-separated list of those), an ``nn.Module`` subclass, or a list/tuple of those.
    Raises :class:`~ampkit.errors.UsageError` with a one-line message on anything else.

    >>> normalize_fp32_modules("blocks.0.norm, preset:loss")
    ('blocks.0.norm', 'preset:loss')
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, type)) else value
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise _bad(value, "unsupported value")
    out: list[Spec] = []
    for item in items:
        if isinstance(item, str):
            out.extend(_string_specs(item))
        elif isinstance(item, type) and issubclass(item, nn.Module):
            out.append(item)
        else:
            raise _bad(item, "not a name, glob, preset or nn.Module subclass")
    return tuple(dict.fromkeys(out))


def strip_wrapper_prefixes(name: str) -> str:
    """``"_orig_mod.module.blocks.0"`` -> ``"blocks.0"``: the name in the user's own model."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
        if name in ("_orig_mod", "module"):
            name, changed = "", True
    return name


def _spec_label(spec: Spec) -> str:
    return spec.__name__ if isinstance(spec, type) else spec


def _matches(spec: Spec, name: str, module: nn.Module) -> bool:
    if isinstance(spec, type):
        return isinstance(module, spec)
    if not name:  # the root (or a wrapper around it) is only reachable through a type
        return False
    if spec.startswith("preset:"):
        return PRESETS[spec[len("preset:"):]].match(name, module)
    return fnmatch.fnmatchcase(name, spec)


def _to_fp32(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in _LOW else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_fp32(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_fp32(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_fp32(v)) for k, v in obj.items())
    return obj


class FP32Regions:
    """The hooks that keep matched modules in FP32. Use :meth:`remove` (or ``with``) to take them off.

    Attributes:
        names: the qualified names (wrapper prefixes stripped) of the matched modules, sorted.
        specs: the normalised specs that were applied.
        device_type: the autocast device type the regions turn off.
    """

    def __init__(self, model: nn.Module, specs: tuple[Spec, ...], device_type: str) -> None:
        self.specs = specs
        self.device_type = device_type
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._depth = 0  # how many matched modules are running right now (nesting)
        self._ctx: torch.autocast | None = None
        modules: dict[int, nn.Module] = {}
        names: set[str] = set()
        named = [(strip_wrapper_prefixes(n), m) for n, m in model.named_modules(remove_duplicate=False)]
        for spec in specs:
            hits = [(n, m) for n, m in named if _matches(spec, n, m)]
            if not hits:
                real = [n for n, _ in named if n][:5]
                raise UsageError(f"fp32_modules: {_spec_label(spec)!r} matches no module of "
                                 f"{type(model).__name__}; its modules are named like {', '.join(real) or '(none)'}")
            for n, m in hits:
                modules[id(m)] = m
                names.add(n or type(m).__name__)  # the root, matched by type, goes by its class name
        self.names: tuple[str, ...] = tuple(sorted(names))
        for module in modules.values():
            self._install(module)

    def _install(self, module: nn.Module) -> None:
        entered: list[bool] = []  # per module: which of its calls entered (recursion-safe)

        def pre_hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if self._depth == 0:
                ctx = torch.autocast(device_type=self.device_type, enabled=False)
                ctx.__enter__()
                self._ctx = ctx
            self._depth += 1
            entered.append(True)
            return _to_fp32(args), _to_fp32(kwargs)

        def post_hook(mod: nn.Module, args: tuple, output: Any) -> None:
            if not entered:  # an earlier pre-hook raised before ours ran
                return None
            entered.pop()
            self._depth -= 1
            if self._depth == 0 and self._ctx is not None:
                ctx, self._ctx = self._ctx, None
                ctx.__exit__(None, None, None)
            return None

        # Under torch.compile the hooks run eagerly (a graph break on each side of the region): dynamo
        # cannot trace an autocast context entered in one function and left in another, and it guards
        # the graphs on the autocast state, so the region's graph is compiled with autocast off.
        pre_hook = torch.compiler.disable(pre_hook)
        post_hook = torch.compiler.disable(post_hook)
        self._handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True))
        self._handles.append(module.register_forward_hook(post_hook, always_call=True))

    def remove(self) -> None:
        """Remove every hook (idempotent). The model then behaves exactly as if never hooked."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def active(self) -> bool:
        """True while the hooks are installed."""
        return bool(self._handles)

    def __enter__(self) -> "FP32Regions":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"FP32Regions(names={list(self.names)}, active={self.active})"


def apply_fp32_regions(model: nn.Module, specs: Any, *, device_type: str) -> FP32Regions:
    """Keep the modules of ``model`` matched by ``specs`` in FP32 under autocast on ``device_type``.

    ``specs`` is anything :func:`normalize_fp32_modules` accepts. A spec that matches no module is a
    :class:`~ampkit.errors.UsageError` naming the spec and a few real module names.

    >>> model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    >>> with apply_fp32_regions(model, "preset:norm", device_type="cpu") as regions:
    ...     with torch.autocast("cpu", dtype=torch.bfloat16):
    ...         out = model(torch.randn(2, 4))
    >>> regions.names, out.dtype
    (('1',), torch.float32)
    """
    return FP32Regions(model, normalize_fp32_modules(specs), str(device_type))

