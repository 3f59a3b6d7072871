"""What a training run depends on: :class:`TrainConfig`, frozen, validated before any process starts.

Its own module so that the run's parts (:mod:`.setup`, :mod:`.loop`, ...) and :func:`~ampkit.training.trainer`
import it without a circle.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field
from typing import Any

from ampkit import distributed as dist_mod
from ampkit.choices import FP8_LAYERS, FP8_RECIPES
from ampkit.engine.config import AmpConfig
from ampkit.engine.regions import normalize_fp32_modules
from ampkit.errors import UsageError
from ampkit.training.stop import parse_signal

__all__ = ["TrainConfig"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run depends on. ``steps`` is the run's total number of optimizer steps.

    ``callbacks``: :class:`~ampkit.training.callbacks.Callback` objects, or ``FILE.py:factory`` /
    ``module:factory`` specs (what ``--callback`` passes; under torchrun each rank builds its own).
    ``stop_signal``: a signal that stops the run like SIGTERM (e.g. ``"SIGUSR1"``, a scheduler's warning).
    ``stop_check_every``: with several ranks, how often (in steps) they agree on a stop: one small
    all_reduce and one host read every N steps; a stop takes effect at most N steps after the signal.
    ``init_scale``: the FP16 loss scaler's initial scale (default 65536).
    ``graph``: capture the whole training step (forward, backward, clip, optimizer, scaler) as one device
    graph where it can (CUDA graphs; MUSA graphs from QY2 on). None (the default): wherever possible, and
    one note says why not where it is not; False: eager steps (``--no-graph``). Losses, skips, metrics,
    checkpoints and resume are the same either way.
    ``fp32_modules``: modules kept in FP32 under autocast (names, globs such as ``"*.norm"``, module
    types, presets such as ``"preset:norm"``; a comma-separated string too): see :mod:`ampkit.engine.regions`.

    >>> cfg = ampkit.TrainConfig(task="digits", precision="bf16", steps=100, out="runs/d", ckpt_every=50)
    >>> cfg.log_every, cfg.keep
    (10, 3)
    """

    task: str = "digits"
    task_options: dict[str, Any] = field(default_factory=dict)
    precision: str = "auto"
    steps: int | None = None  # None: the task's default
    seed: int = 0
    out: str | None = None
    ckpt_every: int | None = None
    keep: int = 3
    log_every: int = 10
    resume: bool = False
    max_grad_norm: float | None = 1.0
    accumulation_steps: int = 1
    lr: float | None = None
    device: str | None = None
    fused: bool | None = None  # None: fused where the device has it
    tf32: bool | None = None
    tensorboard: bool = False
    evaluate: bool = True
    max_consecutive_skips: int | None = 50
    # "ddp" | "fsdp" under torchrun (see ampkit.distributed); None: DDP when torchrun starts more than
    # one process. Without torchrun a strategy runs one process (fsdp: in the sharded checkpoint format).
    strategy: str | None = None
    init_scale: float | None = None
    fp32_modules: Any = None
    callbacks: tuple[Any, ...] = ()
    stop_signal: str | None = None
    stop_check_every: int = 10
    graph: bool | None = None
    fp8_recipe: str = "tensorwise"  # with precision "fp8": torchao's "tensorwise", "rowwise" or "rowwise_with_gw_hp"
    # with precision "fp8": "paying", the layers the FP8 cost model predicts faster; "eligible", all the filter allows
    fp8_layers: str = "paying"
    # how the weights are stored (ampkit.engine.master): "fp32", "bf16" (exact remainders), "bf16-pure"
    weights: str = "fp32"

    def validate(self) -> None:
        if self.fp8_recipe not in FP8_RECIPES:
            raise UsageError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_layers not in FP8_LAYERS:
            raise UsageError(f"fp8_layers must be one of {', '.join(FP8_LAYERS)}, got {self.fp8_layers!r}")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be a positive number of optimizer steps, got {self.steps}")
        for name in ("log_every", "accumulation_steps", "keep"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.ckpt_every is not None and self.ckpt_every < 1:
            raise UsageError(f"--ckpt-every must be >= 1, got {self.ckpt_every}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if (self.resume or self.ckpt_every) and not self.out:
            raise UsageError("--resume and --ckpt-every need --out DIR (where checkpoints live)")
        if self.strategy is not None and self.strategy not in dist_mod.STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(dist_mod.STRATEGIES)}, got {self.strategy!r}")
        if self.init_scale is not None and not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise UsageError(f"--init-scale must be a positive number, got {self.init_scale}")
        if self.stop_check_every < 1:
            raise UsageError(f"--stop-check-every must be >= 1, got {self.stop_check_every}")
        self.stop_signals()
        normalize_fp32_modules(self.fp32_modules)
        self.amp_config()  # the engine's own checks (e.g. --max-grad-norm nan), before any process starts

    def amp_config(self) -> AmpConfig:
        """The engine's settings for this run (its ``fp32_modules`` are installed with ``amp.attach(model)``)."""
        changes: dict[str, Any] = {"max_grad_norm": self.max_grad_norm, "accumulation_steps": self.accumulation_steps,
                                   "max_consecutive_skips": self.max_consecutive_skips}
        if self.fp32_modules:
            changes["fp32_modules"] = self.fp32_modules
        if self.init_scale is not None:
            changes["init_scale"] = self.init_scale
        if self.weights != "fp32":
            changes["weights"] = self.weights
        return AmpConfig(**changes)

    def stop_signals(self) -> tuple[int, ...]:
        """The signal numbers that stop the run gracefully: SIGINT, SIGTERM and ``stop_signal``."""
        extra = (int(parse_signal(self.stop_signal)),) if self.stop_signal else ()
        return tuple(dict.fromkeys((int(signal.SIGINT), int(signal.SIGTERM), *extra)))
