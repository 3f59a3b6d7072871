"""Precision switching and step recording for one run of an unmodified script (``compare SCRIPT``, ``audit SCRIPT``).

Part of the diagnose runner, the one place in ampkit that instruments a user's process (DESIGN.md,
rule 1). :class:`Switch` installs its patches on ``__enter__`` and removes them on ``__exit__``; the
script's files are never edited. In one run (one subprocess per run, :mod:`ampkit.diagnose.script_run`):

* **the precision switch**: every ``torch.autocast`` (``torch.amp.autocast``, the deprecated
  ``torch.cuda.amp.autocast`` / ``torch.cpu.amp.autocast`` and every ``torch.<device>.amp.autocast``,
  which all construct ``torch.amp.autocast_mode.autocast``; Accelerate's
  ``get_mixed_precision_context_manager``, Lightning's ``MixedPrecision.forward_context`` and HF
  ``Trainer`` (through Accelerate) call it too) is constructed with ``enabled=False`` in ``"fp32"`` mode,
  and with the forced dtype in ``"amp"`` mode when ``--precision`` gives one; every
  ``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` and Accelerate's / Lightning's scalers are
  that class) with ``enabled=False`` in FP32 and ``enabled=True`` when FP16 is forced. Lightning
  Fabric's ``MixedPrecision.convert_input`` casts the inputs to BF16/FP16 outside autocast: in FP32 it
  leaves them as they are, with a forced dtype it casts to that dtype. Nothing else changes.
* **pure low precision** (:mod:`ampkit.diagnose.dtype_switch`): in FP32 runs, conversions of the model and
  its inputs to FP16/BF16 (``model.half()``, ``.to(torch.bfloat16)``, Fabric ``"bf16-true"``,
  ``from_pretrained(dtype=...)``, ``torch.set_default_dtype``) are no-ops, recorded; AMP runs run as written.
* **refusals** (:class:`Refusal`): a parameter still low precision at the first FP32 step (created so
  directly), ``torch.distributed.init_process_group`` unless the run was launched for several processes
  (:mod:`ampkit.diagnose.script_launch`), and forced FP16 on a script that creates no GradScaler.
* **seeds**: ``torch.manual_seed``, ``torch.<device>.manual_seed(_all)``, ``random.seed`` and
  ``numpy.random.seed`` get :func:`run_seed` ``(value, k)`` instead of ``value``: run k of FP32 and of
  AMP see the same seeds, runs of different k different ones. Lightning's ``seed_everything``,
  ``transformers.set_seed`` and ``accelerate.utils.set_seed`` call these. Explicit generators
  (``torch.Generator().manual_seed``, ``numpy.random.default_rng(s)``) are left as written (the same in
  both precisions).
* **recording**: the loss of every optimizer step is the mean of the tensors the script passed to
  ``Tensor.backward`` or ``GradScaler.scale`` since the step before, kept on the device (detached) and
  read once at the end; a ``GradScaler.step`` that skipped (its own inf check) and the scale it used are
  kept the same way. Steps are counted by the global optimizer step post-hook and by ``GradScaler.step``
  (which may skip ``optimizer.step``). After ``steps`` steps :class:`StopRun` ends the script.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import random
import sys
from typing import Any, Callable

import torch

from ampkit.diagnose.dtype_switch import DtypeSwitch
from ampkit.diagnose.stop import StopRun

__all__ = ["Switch", "Refusal", "run_seed"]

_FABRIC_AMP = ("lightning.fabric.plugins.precision.amp", "lightning_fabric.plugins.precision.amp")
_HF = "transformers.modeling_utils"


class Refusal(BaseException):
    """The script does something under which switching cannot give a trustworthy comparison (one line)."""


def run_seed(value: Any, k: int) -> int:
    """The seed run ``k`` uses where the script asked for ``value``: distinct values stay distinct."""
    try:
        v = int(value) if value is not None else 0
    except (TypeError, ValueError):
        v = hash(str(value))
    return (v * 1_000_003 + k * 7_919 + 12_345) % 2**32


def _dname(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class Switch:
    """The patches of one run. ``mode``: ``"fp32"`` (autocast and scalers off) or ``"amp"`` (as written, or
    ``dtype`` forced); ``seed``: the run's k; ``steps``: stop after this many optimizer steps (None: never);
    ``on_backward`` / ``on_step``: called at each backward and step (the audit records the first step);
    ``distributed``: the run was launched for several processes (``init_process_group`` allowed); ``user_dir``:
    the script's folder (where switched conversions are reported)."""

    def __init__(self, *, mode: str, seed: int, dtype: torch.dtype | None = None, steps: int | None = None,
                 on_backward: Callable[[], None] | None = None, on_step: Callable[[int], None] | None = None,
                 distributed: bool = False, user_dir: str | None = None) -> None:
        if mode not in ("fp32", "amp"):
            raise ValueError(f"mode must be 'fp32' or 'amp', got {mode!r}")
        self.mode, self.seed, self.dtype, self.max_steps = mode, seed, dtype, steps
        self.on_backward, self.on_step = on_backward, on_step
        self.distributed = distributed
        self.dtypes = DtypeSwitch(mode, user_dir, Refusal)
        self.step = 0
        self.autocast_seen: set[str] = set()  # "device:dtype" of every enabled autocast constructed
        self.scalers = 0  # GradScalers the script created
        self.scaler_enabled = False
        self._micro: list[torch.Tensor] = []
        self._scaled: list[torch.Tensor] = []  # outputs of GradScaler.scale this step (not losses themselves)
        self.losses: list[torch.Tensor | None] = []
        self.skips: list[torch.Tensor | None] = []
        self.scales: list[torch.Tensor | None] = []
        self._in_scaler_step = False
        self._busy = 0
        self.quiet: Any = None  # an object with ``recording`` (the audit's state): off during ampkit's own ops
        self._undo: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ install / remove
    def __enter__(self) -> "Switch":
        try:
            self._install()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        had = name in owner.__dict__ if isinstance(owner, type) else hasattr(owner, name)
        raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        setattr(owner, name, make(getattr(owner, name)))
        self._undo.append(lambda: setattr(owner, name, raw) if had else delattr(owner, name))

    def _install(self) -> None:
        import torch.optim.optimizer as optim_mod

        handle = optim_mod.register_optimizer_step_post_hook(self._opt_post_hook)
        self._undo.append(handle.remove)
        self._patch(torch.amp.autocast_mode.autocast, "__init__", self._wrap_autocast_init)
        gs = torch.amp.GradScaler
        self._patch(gs, "__init__", self._wrap_scaler_init)
        self._patch(gs, "scale", self._wrap_scale)
        self._patch(gs, "step", self._wrap_scaler_step)
        self._patch(torch.Tensor, "backward", self._wrap_backward)
        self.dtypes.install(self._patch, self._undo)
        import torch.distributed as dist

        if hasattr(dist, "init_process_group") and not self.distributed:
            self._patch(dist, "init_process_group", self._refuse_distributed)
            if hasattr(dist, "distributed_c10d"):
                self._patch(dist.distributed_c10d, "init_process_group", self._refuse_distributed)
        self._install_seeds()
        targets = {name: self._patch_fabric for name in _FABRIC_AMP}
        if self.mode == "fp32":
            targets[_HF] = lambda module: self.dtypes.patch_hf(module, self._patch)
        finder = _PostImport(targets)
        sys.meta_path.insert(0, finder)
        self._undo.append(lambda: sys.meta_path.remove(finder))
        for name in _FABRIC_AMP:  # imported before the run (rare): patch now
            if name in sys.modules:
                self._patch_fabric(sys.modules[name])

    # ------------------------------------------------------------------ seeds
    def _install_seeds(self) -> None:
        from ampkit.device import DEVICE_TYPES

        k = self.seed

        def seeding(orig):
            def seed_fn(*args, **kwargs):
                value = args[0] if args else kwargs.pop("seed", kwargs.pop("a", None))
                return orig(run_seed(value, k), *args[1:], **kwargs)

            return seed_fn

        self._patch(torch, "manual_seed", seeding)
        self._patch(torch.random, "manual_seed", seeding)
        for dev in DEVICE_TYPES:
            module = getattr(torch, dev, None) if dev != "cpu" else None
            for name in ("manual_seed", "manual_seed_all"):
                if module is not None and callable(getattr(module, name, None)):
                    self._patch(module, name, seeding)
        self._patch(random, "seed", seeding)
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
            numpy = None
        if numpy is not None:
            self._patch(numpy.random, "seed", seeding)
            numpy.random.seed(0)
        random.seed(0)
        torch.manual_seed(0)  # what runs before the script seeds (or when it never does): seeded too

    # ------------------------------------------------------------------ the precision switch
    def _wrap_autocast_init(self, orig):
        sw = self
        sig = inspect.signature(orig)

        def __init__(ac, *args, **kwargs):
            if torch.compiler.is_compiling():
                return orig(ac, *args, **kwargs)
            bound = sig.bind(ac, *args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if sw.mode == "fp32":
                a["enabled"] = False
            elif a["enabled"] and sw.dtype is not None:
                a["dtype"] = sw.dtype
            orig(*bound.args, **bound.kwargs)
            if getattr(ac, "_enabled", False):
                sw.autocast_seen.add(f"{ac.device}:{_dname(ac.fast_dtype)}")

        return __init__

    def _wrap_scaler_init(self, orig):
        sw = self
        sig = inspect.signature(orig)

        def __init__(scaler, *args, **kwargs):
            bound = sig.bind(scaler, *args, **kwargs)
            bound.apply_defaults()
            if sw.mode == "fp32":
                bound.arguments["enabled"] = False
            elif sw.dtype == torch.float16:
                bound.arguments["enabled"] = True
            orig(*bound.args, **bound.kwargs)
            sw.scalers += 1
            sw.scaler_enabled = sw.scaler_enabled or bool(scaler.is_enabled())

        return __init__

    def _patch_fabric(self, module: Any) -> None:
        cls = getattr(module, "MixedPrecision", None)
        if cls is None or "convert_input" not in cls.__dict__:
            return
        sw = self

        def wrap(orig):
            def convert_input(plugin, data):
                if sw.mode == "fp32":
                    return data
                if sw.dtype is not None:
                    saved = plugin._desired_input_dtype
                    plugin._desired_input_dtype = sw.dtype
                    try:
                        return orig(plugin, data)
                    finally:
                        plugin._desired_input_dtype = saved
                return orig(plugin, data)

            return convert_input

        self._patch(cls, "convert_input", wrap)

    # ------------------------------------------------------------------ refusals
    def _refuse_distributed(self, orig):
        def init_process_group(*args, **kwargs):
            raise Refusal("the script starts torch.distributed (init_process_group) in one process: launch it as "
                          "you do, e.g. `ampkit compare --nproc 2 SCRIPT` or `ampkit compare -- torchrun "
                          "--nproc-per-node 2 SCRIPT`")

        return init_process_group

    # ------------------------------------------------------------------ recording
    def _enter_busy(self) -> bool:
        self._busy += 1
        was = getattr(self.quiet, "recording", False)
        if was:
            self.quiet.recording = False
        return was

    def _leave_busy(self, was: bool) -> None:
        self._busy -= 1
        if was:
            self.quiet.recording = True

    def _record(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            was = self._enter_busy()
            try:
                self._micro.append(t.detach().float().mean())
            finally:
                self._leave_busy(was)

    def _wrap_backward(self, orig):
        sw = self

        def backward(t, *args, **kwargs):
            if not sw._busy and not any(t is s for s in sw._scaled):
                if sw.mode == "amp" and sw.dtype == torch.float16 and not sw.scaler_enabled:
                    raise Refusal("--precision fp16 needs loss scaling and this script creates no GradScaler: "
                                  "run it as written, or create `torch.amp.GradScaler(enabled=...)` in the script "
                                  "(ampkit enables it in FP16 runs and disables it in FP32 runs)")
                sw._record(t)
                if sw.on_backward is not None:
                    sw.on_backward()
            return orig(t, *args, **kwargs)

        return backward

    def _wrap_scale(self, orig):
        sw = self

        def scale(scaler, outputs):
            out = orig(scaler, outputs)
            if not sw._busy:
                sw._record(outputs)
                if out is not outputs:
                    sw._scaled.append(out)
            return out

        return scale

    def _wrap_scaler_step(self, orig):
        sw = self

        def step(scaler, optimizer, *args, **kwargs):
            if sw._busy:
                return orig(scaler, optimizer, *args, **kwargs)
            sw._in_scaler_step = True
            try:
                ret = orig(scaler, optimizer, *args, **kwargs)
            finally:
                sw._in_scaler_step = False
            skip = scale = None
            if scaler.is_enabled():
                was = sw._enter_busy()
                try:
                    state = scaler._per_optimizer_states.get(id(optimizer), {})
                    found = list(state.get("found_inf_per_device", {}).values())
                    if found:
                        skip = torch.stack([f.to(found[0].device).float() for f in found]).sum().clamp(max=1.0)
                    if scaler._scale is not None:
                        scale = scaler._scale.detach().clone().float().reshape(())
                finally:
                    sw._leave_busy(was)
            sw._count(skip, scale)
            return ret

        return step

    def _opt_post_hook(self, optimizer, args, kwargs) -> None:
        if self.step == 0 and self.mode == "fp32":
            self.dtypes.check_params(optimizer)
        elif self.step == 0:  # AMP runs first: low-precision parameters say which precision the script trains in
            self.dtypes.note_low_params(optimizer)
        if not self._in_scaler_step and not self._busy:
            self._count(None, None)

    def _count(self, skip: torch.Tensor | None, scale: torch.Tensor | None) -> None:
        was = self._enter_busy()
        try:
            loss = torch.stack([m.to(self._micro[0].device) for m in self._micro]).mean() if self._micro else None
        finally:
            self._leave_busy(was)
        self.losses.append(loss)
        self.skips.append(skip)
        self.scales.append(scale)
        self._micro, self._scaled = [], []
        self.step += 1
        if self.on_step is not None:
            self.on_step(self.step)
        if self.max_steps is not None and self.step >= self.max_steps:
            raise StopRun(f"stopped after {self.max_steps} optimizer steps")

    def read(self) -> dict[str, list]:
        """Every step's loss, skip flag and scale, read from the device once (None where there is none)."""
        return {"losses": _host(self.losses), "skipped": _host(self.skips), "scales": _host(self.scales)}


def _host(values: list[torch.Tensor | None]) -> list[float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return [None] * len(values)
    got = iter(torch.stack([v.to(present[0].device) for v in present]).cpu().tolist())
    return [next(got) if v is not None else None for v in values]


class _PostImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` right after one of the named modules is imported (Lightning's AMP plugin)."""

    def __init__(self, targets: dict[str, Callable[[Any], None]]) -> None:
        self.targets = targets

    def find_spec(self, fullname, path, target=None):
        patch = self.targets.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            patch(module)

        loader.exec_module = exec_module
        return spec
