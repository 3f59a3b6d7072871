"""The engine's settings as one frozen, keyword-only value with named presets.

>>> from ampkit.engine.config import AmpConfig
>>> cfg = AmpConfig.preset("fp16-safe")
>>> cfg.init_scale, cfg.max_grad_norm
(1024.0, 1.0)
>>> AmpConfig(max_grad_norm=0).clip_norm is None   # 0 means "no clipping", as --max-grad-norm 0
True
>>> cfg.replace(accumulation_steps=4).accumulation_steps
4

``MixedPrecision(precision, config=cfg, max_grad_norm=0.5)`` takes a config and keyword overrides;
``TrainConfig``, bench and the CLI build their engine through this one type.

Why it is built this way:

* One place validates every setting, up front, with a one-line :class:`~ampkit.errors.UsageError`
  that says what to pass instead (torch's ``GradScaler`` raises a bare ``AssertionError`` for some of
  these and silently accepts others, e.g. a NaN clipping norm that writes NaN weights).
* ``max_grad_norm``: ``None`` and ``0`` both mean "no clipping" (the CLI has always taken
  ``--max-grad-norm 0`` that way); negative, NaN and infinite values are refused.
* Nothing writes into a frozen instance: values are checked as given (``clip_norm`` and
  ``fp32_specs`` read them in their normal form), and ``replace`` builds a new, checked one.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from ampkit.choices import WEIGHTS
from ampkit.errors import UsageError

__all__ = ["AmpConfig", "PRESETS", "DEFAULT_SKIP_CHECK_EVERY"]

#: Steps between the engine's host reads of the consecutive-skip counter when ``max_consecutive_skips`` is
#: set and ``skip_check_every`` is not: one device->host read per 100 steps (at most 100 steps late).
DEFAULT_SKIP_CHECK_EVERY = 100


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fp32_modules(value: Any) -> tuple[Any, ...]:
    """The fp32_modules value as a flat tuple of specs, checked by :func:`ampkit.engine.regions.normalize_fp32_modules`
    (imported here, lazily: it needs torch)."""
    from ampkit.engine.regions import normalize_fp32_modules

    return normalize_fp32_modules(value)


@dataclass(frozen=True, kw_only=True)
class AmpConfig:
    """Settings of :class:`ampkit.MixedPrecision`, checked when made.

    Attributes:
        max_grad_norm: clip the global gradient norm (after unscaling) to this; None or 0: no clipping.
        accumulation_steps: backward passes per optimizer step (integer >= 1).
        init_scale: the FP16 loss scale to start from (> 0).
        growth_factor: multiply the scale by this after ``growth_interval`` finite steps (> 1).
        backoff_factor: multiply the scale by this on a non-finite step (0 < x < 1).
        growth_interval: finite steps in a row before the scale grows (integer >= 1).
        min_scale: the FP16 scale never goes below this (>= 0; 0: no floor).
        max_consecutive_skips: stop training (:class:`~ampkit.errors.TrainingHalted`) after this many
            skipped steps in a row; None: never.
        skip_check_every: the engine reads the consecutive-skip counter on the host once every this many
            optimizer steps (None: ``DEFAULT_SKIP_CHECK_EVERY``, 100) so the limit halts a loop that never
            calls ``stats()``; ``stats()`` checks it too.
        fp32_modules: modules that run in FP32 with autocast off: qualified names, glob patterns
            (``"*.norm"``), presets (``"preset:norm"``) or module types; see :mod:`ampkit.engine.regions`.
        weights: how the weights are stored (:mod:`ampkit.engine.master`): ``"fp32"`` (the default: FP32
            weights, autocast casts per op), ``"bf16"`` (BF16 weights plus a 16-bit remainder each, updated
            exactly as FP32; BF16 precision only; installed by ``amp.attach(model)``), ``"bf16-pure"`` (BF16
            weights, no master copy: what ``model.to(torch.bfloat16)`` training does, for ``compare`` to measure).

    >>> cfg = ampkit.AmpConfig.preset("fp16-safe", max_grad_norm=0.5)
    >>> cfg.init_scale, cfg.max_grad_norm, cfg.fp32_modules
    (1024.0, 0.5, ('preset:norm',))
    >>> amp = ampkit.MixedPrecision("fp16", config=cfg, device="cpu")
    """

    max_grad_norm: float | None = None
    accumulation_steps: int = 1
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_consecutive_skips: int | None = 50
    skip_check_every: int | None = None
    fp32_modules: Any = ()
    weights: str = "fp32"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~ampkit.errors.UsageError` naming the first bad setting and what to pass."""
        norm = self.max_grad_norm
        if norm is not None and (not _is_real(norm) or not math.isfinite(norm) or norm < 0):
            raise UsageError(f"max_grad_norm must be a finite number > 0 (None or 0: no clipping), got {norm!r}")
        if not _is_int(self.accumulation_steps) or self.accumulation_steps < 1:
            raise UsageError(f"accumulation_steps must be an integer >= 1, got {self.accumulation_steps!r}")
        if not _is_real(self.init_scale) or not math.isfinite(self.init_scale) or self.init_scale <= 0:
            raise UsageError(f"init_scale must be a finite number > 0 (e.g. 65536 or 1024), got {self.init_scale!r}")
        if not _is_real(self.growth_factor) or not math.isfinite(self.growth_factor) or self.growth_factor <= 1:
            raise UsageError(f"growth_factor must be a finite number > 1 (e.g. 2.0), got {self.growth_factor!r}")
        if not _is_real(self.backoff_factor) or not 0 < self.backoff_factor < 1:
            raise UsageError(f"backoff_factor must be between 0 and 1, exclusive (e.g. 0.5), got {self.backoff_factor!r}")
        if not _is_int(self.growth_interval) or self.growth_interval < 1:
            raise UsageError(f"growth_interval must be an integer >= 1 (e.g. 2000), got {self.growth_interval!r}")
        if not _is_real(self.min_scale) or not math.isfinite(self.min_scale) or self.min_scale < 0:
            raise UsageError(f"min_scale must be a finite number >= 0 (0: no floor), got {self.min_scale!r}")
        for name in ("max_consecutive_skips", "skip_check_every"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise UsageError(f"{name} must be an integer >= 1 or None, got {value!r}")
        _fp32_modules(self.fp32_modules)
        if self.weights not in WEIGHTS:
            raise UsageError(f"weights takes {', '.join(WEIGHTS)}, got {self.weights!r}")

    @property
    def clip_norm(self) -> float | None:
        """The norm to clip to, or None for no clipping (``max_grad_norm`` None or 0)."""
        return float(self.max_grad_norm) if self.max_grad_norm else None

    @property
    def fp32_specs(self) -> tuple[Any, ...]:
        """``fp32_modules`` as a flat tuple (comma-separated strings split)."""
        return _fp32_modules(self.fp32_modules)

    @property
    def check_every(self) -> int | None:
        """Steps between host reads of the skip counter; None when there is no skip limit."""
        if self.max_consecutive_skips is None:
            return None
        return self.skip_check_every or DEFAULT_SKIP_CHECK_EVERY

    def replace(self, **changes: Any) -> "AmpConfig":
        """A copy with ``changes`` applied and checked (unknown names are a UsageError)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UsageError(f"unknown engine setting(s) {', '.join(unknown)}: known are "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **changes: Any) -> "AmpConfig":
        """A named preset (see :data:`PRESETS`), optionally with ``changes`` applied."""
        key = str(name).strip().lower()
        if key not in PRESETS:
            raise UsageError(f"unknown engine preset {name!r}: choose one of {', '.join(sorted(PRESETS))}")
        return PRESETS[key].replace(**changes) if changes else PRESETS[key]

    def to_dict(self) -> dict[str, Any]:
        """Plain values (module types as their qualified names) for logs, JSON and checkpoints."""
        out = dataclasses.asdict(self)
        out["fp32_modules"] = [m if isinstance(m, str) else f"{m.__module__}.{m.__qualname__}"
                               for m in self.fp32_specs]
        return out


#: Named presets. ``default``: ampkit's defaults. ``torch``: exactly ``torch.amp.GradScaler``'s behaviour
#: (no scale floor, no skip limit, no clipping). ``fp16-safe``: a small starting scale that grows sooner,
#: clipping at 1.0 and the norm layers in FP32 (for FP16 runs that overflow early). ``llm``: clipping at 1.0,
#: norm layers in FP32, a tighter skip limit.
PRESETS: dict[str, AmpConfig] = {
    "default": AmpConfig(),
    "torch": AmpConfig(min_scale=0.0, max_consecutive_skips=None),
    "fp16-safe": AmpConfig(init_scale=2.0**10, growth_interval=500, max_grad_norm=1.0,
                           fp32_modules=("preset:norm",)),
    "llm": AmpConfig(max_grad_norm=1.0, fp32_modules=("preset:norm",), max_consecutive_skips=20,
                     skip_check_every=20),
}
