"""FP8 training: torchao's float8 linear layers under BF16 autocast, on cards that have FP8 matmuls.

ampkit writes no FP8 GEMM code: :func:`convert` swaps chosen ``nn.Linear`` layers for torchao's
``Float8Linear`` (``torchao.float8.convert_to_float8_training``) in place and reports which ones it
converted and why it kept the others in BF16. Everything else runs under BF16 autocast
(``--precision fp8`` resolves to BF16 autocast without a loss scaler, see :mod:`ampkit.device.policy`).

>>> report = convert(model, recipe="tensorwise")          # doctest: +SKIP
>>> report.summary()                                       # doctest: +SKIP
'FP8 tensorwise: 96 of 97 linear layers converted; kept in BF16: lm_head (output head)'

Convert after the model is on its device and before ``torch.compile``; the swapped layers keep the
same ``weight``/``bias`` Parameter objects, so an optimizer built earlier still holds them, and their
state-dict keys are those of ``nn.Linear``: checkpoints load into BF16/FP32 models and back.

The filter (:class:`FP8Filter`) keeps in BF16 what FP8 makes slower or worse:

* layers whose in/out features are not multiples of 16 (``torch._scaled_mm`` cannot take them);
* layers FP8 would make slower: with a cost model (:mod:`ampkit.engine.fp8_cost`, measured on this card by a
  short probe at first use, eager and compiled apart) and the tokens per step M, a layer of K in and N out
  features converts only where FP8 is predicted faster at (M, K, N); without one, small layers (either
  dimension below ``min_features``, 256 by default) stay in BF16;
* the output head (by name: ``head``, ``lm_head``, ``output``, ``classifier``; else the last
  ``nn.Linear`` registered): the logits are the most precision-sensitive matmul;
* anything matched by ``keep`` (globs over qualified names, as for ``fp32_modules``).

torchao is an optional extra (``pip install 'ampkit[fp8]'``), imported only when needed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from ampkit.choices import FP8_RECIPES
from ampkit.compat import INSTALL_HINT, require_torchao, torchao_missing
from ampkit.errors import AmpkitError, UsageError
from ampkit.engine.fp8_cost import CostModel
from ampkit.engine.regions import strip_wrapper_prefixes

__all__ = ["RECIPES", "DEFAULT_RECIPE", "FP8Filter", "FP8Report", "plan", "convert", "torchao_missing",
           "require_torchao", "INSTALL_HINT"]

RECIPES = FP8_RECIPES
DEFAULT_RECIPE = RECIPES[0]
HEAD_NAMES = ("head", "lm_head", "output", "classifier")


def _recipe(recipe: str) -> str:
    name = str(recipe).strip().lower()
    if name not in RECIPES:
        raise UsageError(f"unknown FP8 recipe {recipe!r}: use one of {', '.join(RECIPES)}")
    return name


@dataclass(frozen=True, kw_only=True)
class FP8Filter:
    """Which ``nn.Linear`` layers become FP8. The defaults suit transformer blocks (d >= 256).

    Attributes:
        min_features: keep a layer in BF16 when its in or out features are below this (default: 256 when no
            cost model decides, none with one).
        multiple_of: keep a layer in BF16 when a dimension is not a multiple of this (FP8 GEMM needs 16).
        keep: globs over qualified module names to keep in BF16 in any case.
        keep_head: keep the output head in BF16 (by name, else the last ``nn.Linear`` registered).
    """

    min_features: int | None = None
    multiple_of: int = 16
    keep: tuple[str, ...] = ()
    keep_head: bool = True

    def __post_init__(self) -> None:
        if (self.min_features is not None and self.min_features < 1) or self.multiple_of < 1:
            raise UsageError("FP8Filter: min_features and multiple_of must be >= 1")
        if isinstance(self.keep, str):
            raise UsageError("FP8Filter: keep takes a tuple of globs, e.g. keep=('blocks.0.*',)")

    def reason_to_keep(self, name: str, layer: nn.Linear, *, is_head: bool, costed: bool = False) -> str | None:
        """Why ``layer`` stays in BF16 by its name and shape, or None when it may become FP8 (``costed``: a cost
        model decides on speed, so ``min_features`` applies only when set)."""
        if any(fnmatch.fnmatchcase(name, g) for g in self.keep):
            return "kept by the filter's keep list"
        if self.keep_head and is_head:
            return "output head"
        dims = (layer.in_features, layer.out_features)
        if any(d % self.multiple_of for d in dims):
            return f"shape {dims[0]}x{dims[1]} not divisible by {self.multiple_of}"
        floor = self.min_features if self.min_features is not None or costed else 256
        if floor is not None and min(dims) < floor:
            return f"small: {dims[0]}x{dims[1]} (a dimension below {floor})"
        return None


@dataclass(frozen=True)
class FP8Report:
    """What :func:`plan` decided (and :func:`convert` did): the layers in FP8 and, for each one kept in BF16, why.

    With a cost model, ``predicted`` holds ``(name, bf16_ms, fp8_ms)`` for every layer it judged (forward +
    backward at ``tokens`` tokens), ``cost_source`` where its figures came from and ``mode`` eager or compiled.
    """

    recipe: str
    converted: tuple[str, ...]
    kept: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (name, reason)
    tokens: int | None = None
    mode: str | None = None
    cost_source: str | None = None
    predicted: tuple[tuple[str, float, float], ...] = field(default_factory=tuple)

    def predicted_ms(self) -> tuple[float, float] | None:
        """The judged layers' predicted milliseconds per step: all in BF16, and as planned; None without a model."""
        if not self.predicted:
            return None
        chosen = set(self.converted)
        bf16 = sum(b for _, b, _ in self.predicted)
        return bf16, sum(f if name in chosen else b for name, b, f in self.predicted)

    @property
    def speedup(self) -> float | None:
        """Predicted BF16 time over planned time of the judged layers (1.0: nothing gained)."""
        ms = self.predicted_ms()
        return None if ms is None or ms[1] <= 0 else ms[0] / ms[1]

    def summary(self) -> str:
        """One line for people: ``"FP8 tensorwise: 2 of 3 linear layers converted; kept in BF16: head (output head)"``."""
        total = len(self.converted) + len(self.kept)
        line = f"FP8 {self.recipe}: {len(self.converted)} of {total} linear layers converted"
        if self.kept:
            shown = "; ".join(f"{n} ({why})" for n, why in self.kept[:6])
            more = f"; and {len(self.kept) - 6} more" if len(self.kept) > 6 else ""
            line += f"; kept in BF16: {shown}{more}"
        if self.speedup is not None:
            line += (f"; predicted {self.speedup:.2f}x on the linear layers at {self.tokens} tokens a step "
                     f"(cost model: {self.cost_source})")
        return line

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recipe": self.recipe, "converted": list(self.converted),
                               "kept": [{"name": n, "reason": r} for n, r in self.kept]}
        if self.predicted:
            out.update(tokens=self.tokens, mode=self.mode, cost_source=self.cost_source, speedup=self.speedup,
                       predicted=[{"name": n, "bf16_ms": b, "fp8_ms": f} for n, b, f in self.predicted])
        return out


def _linears(model: nn.Module) -> list[tuple[str, str, nn.Linear]]:
    """(raw name, user-facing name, layer) for every plain nn.Linear, in registration order.

    Only exact ``nn.Linear``: a subclass has its own forward that torchao's swap would drop, and
    MultiheadAttention's ``out_proj`` (a subclass) is never called as a module, only read."""
    return [(raw, strip_wrapper_prefixes(raw), m) for raw, m in model.named_modules() if type(m) is nn.Linear]


def _head(linears: list[tuple[str, str, nn.Linear]]) -> str | None:
    for _, name, _ in reversed(linears):
        if name.rsplit(".", 1)[-1] in HEAD_NAMES:
            return name
    return linears[-1][1] if linears else None


def plan(model: nn.Module, filter: FP8Filter | Callable[[nn.Module, str], bool] | None = None,
         *, recipe: str = DEFAULT_RECIPE, tokens: int | None = None, cost: CostModel | None = None) -> FP8Report:
    """Decide which linear layers :func:`convert` would turn into FP8, without touching the model
    (and without torchao). ``filter`` is an :class:`FP8Filter` or torchao's
    ``module_filter_fn(module, name) -> bool`` (True: convert). With ``cost`` (a
    :class:`~ampkit.engine.fp8_cost.CostModel`) and ``tokens`` (M, the rows each linear layer sees per step),
    a layer the filter allows converts only where the model predicts FP8 faster at (M, K, N)."""
    recipe = _recipe(recipe)
    linears = _linears(model)
    if not linears:
        raise UsageError(f"FP8: {type(model).__name__} has no nn.Linear layer to convert: use --precision bf16")
    if cost is not None and not (tokens and tokens > 0):
        raise UsageError("FP8 plan: a cost model needs tokens (the rows each linear layer sees per step)")
    head = _head(linears)
    converted, kept, predicted = [], [], []
    for _, name, layer in linears:
        if isinstance(filter, FP8Filter) or filter is None:
            why = (filter or FP8Filter()).reason_to_keep(name, layer, is_head=name == head, costed=cost is not None)
        else:
            why = None if filter(layer, name) else "excluded by the module filter"
        if why is None and cost is not None:
            k, n = layer.in_features, layer.out_features
            bf16_ms, fp8_ms = cost.predict(tokens, k, n)
            predicted.append((name, bf16_ms, fp8_ms))
            if not cost.pays(tokens, k, n):
                why = (f"slower in FP8 {cost.mode}: predicted {bf16_ms / fp8_ms:.2f}x at M={tokens} K={k} N={n}")
        if why is None:
            converted.append(name)
        else:
            kept.append((name, why))
    return FP8Report(recipe, tuple(converted), tuple(kept), tokens=tokens if cost else None,
                     mode=cost.mode if cost else None, cost_source=cost.source() if cost else None,
                     predicted=tuple(predicted))


def convert(model: nn.Module, *, recipe: str = DEFAULT_RECIPE,
            filter: FP8Filter | Callable[[nn.Module, str], bool] | None = None,
            chosen: FP8Report | None = None) -> FP8Report:
    """Swap the chosen ``nn.Linear`` layers of ``model`` for torchao ``Float8Linear`` in place.

    ``recipe``: ``"tensorwise"`` (default; fastest on Hopper), ``"rowwise"`` (finer scales, more
    accurate, slower on Hopper) or ``"rowwise_with_gw_hp"`` (rowwise, the weight gradient in BF16: the most
    accurate). ``filter``: :class:`FP8Filter` (default) or a torchao-style
    ``fn(module, name) -> bool``. ``chosen``: a :func:`plan` already made for this model (e.g. with a cost
    model), converted as it is. Returns an :class:`FP8Report`. Raises
    :class:`~ampkit.errors.UsageError` when no layer qualifies (FP8 would be BF16 under another name).
    """
    report = chosen or plan(model, filter, recipe=recipe)
    if not report.converted:
        raise UsageError(f"FP8: no linear layer of {type(model).__name__} qualifies ({report.summary()}): "
                         "use --precision bf16, or loosen the filter (FP8Filter(min_features=...))")
    float8 = require_torchao()
    names = set(report.converted)
    config = float8.Float8LinearConfig.from_recipe_name(report.recipe)
    float8.convert_to_float8_training(
        model, config=config,
        module_filter_fn=lambda module, fqn: strip_wrapper_prefixes(fqn) in names)
    done = tuple(name for _, name, m in _named_float8(model))
    if set(done) != names:  # torchao skipped or added layers: say so rather than report a wrong list
        raise AmpkitError(f"FP8: torchao converted {len(done)} layers where {len(names)} were chosen; "
                          "report this with your torchao version")
    return report


def _named_float8(model: nn.Module) -> list[tuple[str, str, nn.Module]]:
    return [(raw, strip_wrapper_prefixes(raw), m) for raw, m in model.named_modules()
            if type(m).__name__ == "Float8Linear"]
