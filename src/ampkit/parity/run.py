"""``ampkit parity SCRIPT``: run a script's first steps and compare every op with a reference device.

>>> result = ampkit.parity.parity_script("train.py", ["--lr", "3e-4"], steps=1)   # doctest: +SKIP
>>> result.first.op, result.first.where                                          # doctest: +SKIP
('aten._softmax', 'model.py:41')

The script runs in this interpreter, as ``python SCRIPT ARGS`` would (its ``__main__``, ``sys.argv`` and
``sys.path[0]``), for ``steps`` optimizer steps, eagerly (``torch.compile`` is off while it is recorded: the
compiled kernels are not the ones compared). Every op goes through :class:`~ampkit.parity.recorder.ParityMode`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ampkit.device import detect_device, parse_device
from ampkit.diagnose.runner import error_line, run_as_main
from ampkit.diagnose.stop import StopRun
from ampkit.diagnose.tracking import UserCode
from ampkit.errors import UsageError, first_line
from ampkit.parity.recorder import ModulePaths, OpResult, ParityMode

__all__ = ["ParityResult", "parity_script"]

_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class ParityResult:
    """What ``ampkit parity`` found. ``first`` is the first op off beyond its bound (None: none was);
    ``spread`` the modules (in order) where later ops were off too, with counts."""

    script: str
    device: str
    reference: str
    steps: int
    stopped: str
    error: str | None
    ops_checked: int
    ops_skipped: int
    not_replayable: dict[str, str]
    first: OpResult | None
    off: int
    spread: list[tuple[str, int]] = field(default_factory=list)
    worst_ratio: float = 0.0
    seconds: float = 0.0
    replay_seconds: float = 0.0

    @property
    def same(self) -> bool:
        return self.first is None and self.error is None and self.ops_checked > 0

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "first"}
        out["first"] = self.first.to_dict() if self.first is not None else None
        out["spread"] = [{"module": m, "ops": n} for m, n in self.spread]
        out["same"] = self.same
        return out


def _reference(against: str) -> torch.device:
    text = (against or "cpu").strip()
    try:
        parse_device(text)  # a name that is no device at all: its own message
    except Exception as exc:  # noqa: BLE001 - one line
        raise UsageError(f"--against {text}: {first_line(exc)}") from None
    try:
        dev = detect_device(text)  # an explicit device that is not here is an error, not the CPU
    except Exception:  # noqa: BLE001 - not reachable here: one line in parity's own words
        raise UsageError(f"--against {text}: that device is not reachable on this machine (`ampkit doctor` shows "
                         "what is); on a machine with one device, compare it with the CPU: --against cpu") from None
    return dev.torch_device


@contextlib.contextmanager
def _forced_autocast(precision: str | None) -> Iterator[None]:
    """With ``precision`` (bf16 / fp16): every enabled autocast region runs in that dtype."""
    if precision is None:
        yield
        return
    dtype = _PRECISIONS[precision]
    cls = torch.amp.autocast_mode.autocast
    orig = cls.__init__

    def __init__(self, device_type, dtype_=None, enabled=True, cache_enabled=None, **kw):
        if "dtype" in kw:
            dtype_ = kw.pop("dtype")
        orig(self, device_type, dtype=dtype if enabled else dtype_, enabled=enabled, cache_enabled=cache_enabled)

    cls.__init__ = __init__
    try:
        yield
    finally:
        cls.__init__ = orig


def parity_script(path: str, args: list[str] | tuple[str, ...] = (), *, steps: int = 1, against: str = "cpu",
                  precision: str | None = None) -> ParityResult:
    """Run ``python path *args`` for ``steps`` optimizer steps (the forward and backward before each) and compare
    every op with the reference device ``against`` in FP64. ``precision`` (``"bf16"``/``"fp16"``) forces the dtype of
    the script's enabled autocast regions. Raises :class:`~ampkit.errors.UsageError` for a missing script, a bad
    step count or an unreachable reference device."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    if precision is not None and precision not in _PRECISIONS:
        raise UsageError(f"--precision takes bf16 or fp16 (the dtype forced on the script's autocast), got {precision!r}")
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"script not found: {path}")
    reference = _reference(against)
    user = UserCode(os.path.dirname(full))
    modules = ModulePaths()
    mode = ParityMode(reference=reference, user=user, modules=modules)
    taken = [0]
    devices: set[str] = set()

    def before_step(optimizer: Any, a: Any, k: Any) -> None:
        mode.paused = True

    def after_step(optimizer: Any, a: Any, k: Any) -> None:
        mode.paused = False
        taken[0] += 1
        for group in optimizer.param_groups:
            devices.update(str(p.device) for p in group["params"][:1])
        if taken[0] >= steps:
            raise StopRun(f"stopped after {steps} optimizer step(s)")

    t0 = time.perf_counter()
    stopped, exc = run_as_main(full, list(args), _Recording(mode, modules, (before_step, after_step), precision))
    error = None if exc is None else error_line(exc)
    off = mode.off
    first = off[0] if off else None
    spread: dict[str, int] = {}
    for r in off[1:]:
        spread[r.module] = spread.get(r.module, 0) + 1
    return ParityResult(script=path, device=", ".join(sorted(devices)) or "(no optimizer step)",
                        reference=str(reference), steps=taken[0], stopped=stopped, error=error,
                        ops_checked=mode.checked, ops_skipped=mode.skipped, not_replayable=dict(mode.not_replayable),
                        first=first, off=len(off), spread=list(spread.items())[:8], worst_ratio=mode.worst,
                        seconds=time.perf_counter() - t0, replay_seconds=mode.replay_s)


class _Recording:
    """What surrounds the script while it is recorded (the diagnose runner's ``inst``): the dispatch mode, module
    paths, the optimizer-step hooks, anomaly mode (for the forward line of a backward op), the forced autocast
    dtype, and ``torch.compile`` off (the eager kernels are the ones compared)."""

    def __init__(self, mode: ParityMode, modules: ModulePaths, step_hooks: tuple[Any, Any], precision: str | None):
        self.mode, self.modules, self.step_hooks, self.precision = mode, modules, step_hooks, precision
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "_Recording":
        import torch._dynamo
        import torch.optim.optimizer as optim_mod

        stack = self._stack.__enter__()
        for hook in (optim_mod.register_optimizer_step_pre_hook(self.step_hooks[0]),
                     optim_mod.register_optimizer_step_post_hook(self.step_hooks[1])):
            stack.callback(hook.remove)
        self.modules.install()
        stack.callback(self.modules.remove)
        stack.callback(setattr, torch._dynamo.config, "disable", torch._dynamo.config.disable)
        torch._dynamo.config.disable = True
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")  # anomaly mode's own warning, and the script's
        stack.enter_context(_forced_autocast(self.precision))
        stack.enter_context(torch.autograd.set_detect_anomaly(True, False))
        stack.enter_context(self.mode)
        return self

    def __exit__(self, *exc: Any) -> bool:
        return self._stack.__exit__(*exc)

    def finish(self) -> None:
        """Nothing is left to flush: each op was judged as it ran."""
