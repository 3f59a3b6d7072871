"""The device: the only code in ampkit (with the card table) that names a vendor.

Everything else asks a :class:`Device` what it can do: its torch module, card name,
capability, memory statistics, timing, seeding, grad scaler, TF32 switches, collective
backend and debugging variables.

>>> dev = ampkit.detect_device()   # musa > cuda > xpu > mps > cpu, or $AMPKIT_DEVICE
>>> dev.type, dev.name              # doctest: +SKIP
('cuda', 'NVIDIA H200')
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ampkit.errors import DeviceError

if TYPE_CHECKING:
    from ampkit.device.timer import Timer

__all__ = ["Device", "DEVICE_TYPES", "ENV_VAR"]

ENV_VAR = "AMPKIT_DEVICE"
# Detection order: MUSA first, so that a machine with torch_musa never falls back to
# the CPU silently.
DEVICE_TYPES = ("musa", "cuda", "xpu", "mps", "cpu")

_VENDORS = {"musa": "Moore Threads", "cuda": "NVIDIA", "xpu": "Intel", "mps": "Apple", "cpu": "CPU"}
_COLLECTIVE = {"musa": "mccl", "cuda": "nccl", "xpu": "xccl", "mps": "gloo", "cpu": "gloo"}
_LAUNCH_BLOCKING = {"musa": "MUSA_LAUNCH_BLOCKING", "cuda": "CUDA_LAUNCH_BLOCKING"}
_VISIBLE = {"musa": "MUSA_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}
_ALLOC_CONF = {"musa": "PYTORCH_MUSA_ALLOC_CONF", "cuda": "PYTORCH_CUDA_ALLOC_CONF"}
_EXTRA_DEBUG_ENV = {"musa": ("MUDNN_LOG_LEVEL",), "cuda": ()}


def _load_musa() -> Any | None:
    """Return ``torch.musa`` if torch_musa is installed or already registered, else None.

    Importing torch_musa is what registers ``torch.musa`` (MUSA.md); a broken install is
    treated as absent rather than crashing every command.
    """
    if getattr(torch, "musa", None) is None and importlib.util.find_spec("torch_musa") is not None:
        try:
            importlib.import_module("torch_musa")
        except Exception:  # noqa: BLE001 - a broken driver stack must not crash detection
            return None
    return getattr(torch, "musa", None)


def _module_for(device_type: str) -> Any | None:
    if device_type == "musa":
        return _load_musa()
    if device_type == "cpu":
        return None
    return getattr(torch, device_type, None)


def _available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "mps":
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available())
    module = _module_for(device_type)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # noqa: BLE001 - e.g. a driver/runtime mismatch
        return False


@dataclass(frozen=True)
class Device:
    """One compute device. Cheap, hashable, and safe to pass around.

    ``type`` is one of :data:`DEVICE_TYPES`; ``index`` is None for the CPU.

    >>> dev = ampkit.Device("cpu")
    >>> dev.torch_device, dev.is_accelerator, dev.collective_backend
    (device(type='cpu'), False, 'gloo')
    """

    type: str
    index: int | None = None

    # ------------------------------------------------------------------ identity
    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type) if self.index is None else torch.device(self.type, self.index)

    def __str__(self) -> str:
        return str(self.torch_device)

    @property
    def is_accelerator(self) -> bool:
        return self.type != "cpu"

    @property
    def module(self) -> Any | None:
        """``torch.musa`` / ``torch.cuda`` / ``torch.xpu`` / ``torch.mps``; None for the CPU."""
        return _module_for(self.type)

    @property
    def vendor(self) -> str:
        return _VENDORS.get(self.type, self.type)

    @property
    def is_musa(self) -> bool:
        return self.type == "musa"

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def name(self) -> str:
        """The card name as the driver reports it (``MTT S4000``, ``NVIDIA H200``) or the CPU model."""
        if self.type == "cpu":
            return _cpu_name()
        module = self.module
        try:
            return str(module.get_device_name(self._idx))
        except Exception:  # noqa: BLE001
            return self.type

    @property
    def capability(self) -> tuple[int, int] | None:
        """``(major, minor)`` for MUSA and CUDA cards, None elsewhere."""
        if self.type not in ("musa", "cuda"):
            return None
        try:
            major, minor = self.module.get_device_capability(self._idx)
            return int(major), int(minor)
        except Exception:  # noqa: BLE001
            return None

    @property
    def total_memory(self) -> int | None:
        if self.type not in ("musa", "cuda", "xpu"):
            return None
        try:
            return int(self.module.get_device_properties(self._idx).total_memory)
        except Exception:  # noqa: BLE001
            return None

    @property
    def _idx(self) -> int:
        return 0 if self.index is None else self.index

    # ------------------------------------------------------------------ versions
    def runtime_versions(self) -> dict[str, str | None]:
        """torch and the vendor stack's versions, for reports."""
        versions: dict[str, str | None] = {"torch": torch.__version__}
        if self.type == "musa":
            versions["torch_musa"] = _package_version("torch_musa")
            versions["musa"] = getattr(torch.version, "musa", None)
        elif self.type == "cuda":
            versions["cuda"] = torch.version.cuda
            versions["hip"] = getattr(torch.version, "hip", None)
        return versions

    # ------------------------------------------------------------------ runtime
    def synchronize(self) -> None:
        if self.type == "mps":
            torch.mps.synchronize()
        elif self.is_accelerator and self.module is not None:
            self.module.synchronize(self._idx)

    def set_current(self) -> None:
        """Make this the current device of its backend (needed before NCCL/MCCL init)."""
        if self.type in ("musa", "cuda", "xpu") and self.index is not None:
            self.module.set_device(self.index)

    def max_memory_allocated(self) -> int | None:
        """Peak bytes allocated since the last :meth:`reset_peak_memory_stats`; None on the CPU."""
        return self._mem_call("max_memory_allocated")

    def reset_peak_memory_stats(self) -> None:
        if self.type in ("musa", "cuda", "xpu"):
            try:
                self.module.reset_peak_memory_stats(self._idx)
            except Exception:  # noqa: BLE001
                pass

    def empty_cache(self) -> None:
        if self.is_accelerator and self.module is not None and hasattr(self.module, "empty_cache"):
            self.module.empty_cache()

    def _mem_call(self, fn: str) -> int | None:
        if self.type not in ("musa", "cuda", "xpu"):
            return None
        try:
            return int(getattr(self.module, fn)(self._idx))
        except Exception:  # noqa: BLE001
            return None

    def timer(self) -> "Timer":
        """A stopwatch that measures device time: events on accelerators, a clock on the CPU."""
        from ampkit.device.timer import Timer

        return Timer(self)

    # ------------------------------------------------------------------ RNG
    def manual_seed(self, seed: int) -> None:
        """Seed python, numpy, torch and this device."""
        random.seed(seed)
        try:
            import numpy as np

            np.random.seed(seed % (2**32))
        except ImportError:
            pass
        torch.manual_seed(seed)
        if self.type in ("musa", "cuda", "xpu") and self.module is not None:
            self.module.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor | None:
        if self.type in ("musa", "cuda", "xpu") and self.module is not None:
            return self.module.get_rng_state(self._idx)
        return None

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        if state is not None and self.type in ("musa", "cuda", "xpu") and self.module is not None:
            self.module.set_rng_state(state, self._idx)

    # ------------------------------------------------------------------ AMP
    def grad_scaler(self, *, enabled: bool = True, **kwargs: Any) -> torch.amp.GradScaler:
        """The grad scaler for this device, made in one place (MUSA.md: ``torch.musa.amp.GradScaler``
        is the documented MUSA API; ``torch.amp.GradScaler("musa")`` is only inferred to be equal)."""
        if self.type == "musa":
            amp = getattr(self.module, "amp", None)
            if amp is not None and hasattr(amp, "GradScaler"):
                return amp.GradScaler(enabled=enabled, **kwargs)
        return torch.amp.GradScaler(self.type, enabled=enabled, **kwargs)

    def strict_bf16_supported(self) -> bool | None:
        """``is_bf16_supported`` without the emulation trap (MUSA.md); None where not asked."""
        module = self.module
        if self.type not in ("musa", "cuda") or module is None:
            return None
        fn = getattr(module, "is_bf16_supported", None)
        if fn is None:
            return None
        try:
            return bool(fn(including_emulation=False))
        except TypeError:  # an older signature without the flag: the answer cannot be trusted
            return None

    def supports_fused_optimizer(self) -> bool:
        """Whether torch's fused AdamW/SGD kernels run here (CPU fused needs torch >= 2.4)."""
        if self.type in ("cuda", "musa", "xpu", "mps"):
            return True
        return _torch_at_least(2, 4)

    # ------------------------------------------------------------------ TF32
    def tf32_switches(self) -> dict[str, bool]:
        """Current values of every TF32 switch this backend has, by dotted name."""
        out: dict[str, bool] = {}
        for name, obj, attr in self._tf32_targets():
            out[name] = bool(getattr(obj, attr))
        return out

    def set_tf32(self, enabled: bool) -> dict[str, bool]:
        """Set every TF32 switch of this backend that exists; return what was set."""
        done: dict[str, bool] = {}
        for name, obj, attr in self._tf32_targets():
            try:
                setattr(obj, attr, enabled)
                done[name] = enabled
            except (AttributeError, RuntimeError):  # a read-only property on some builds
                continue
        return done

    def restore_tf32(self, before: dict[str, bool]) -> None:
        """Put each switch named in ``before`` (from :meth:`tf32_switches`) back to its value."""
        for name, obj, attr in self._tf32_targets():
            if name in before:
                with contextlib.suppress(AttributeError, RuntimeError):  # read-only on some builds
                    setattr(obj, attr, before[name])

    def _tf32_targets(self) -> list[tuple[str, Any, str]]:
        targets: list[tuple[str, Any, str]] = []
        backends = torch.backends
        if self.type == "cuda":
            targets.append(("torch.backends.cuda.matmul.allow_tf32", backends.cuda.matmul, "allow_tf32"))
            targets.append(("torch.backends.cudnn.allow_tf32", backends.cudnn, "allow_tf32"))
        elif self.type == "musa":
            mudnn = getattr(backends, "mudnn", None)
            if mudnn is not None and hasattr(mudnn, "allow_tf32"):
                targets.append(("torch.backends.mudnn.allow_tf32", mudnn, "allow_tf32"))
            musa_backend = getattr(backends, "musa", None)
            matmul = getattr(musa_backend, "matmul", None)
            if matmul is not None and hasattr(matmul, "allow_tf32"):
                targets.append(("torch.backends.musa.matmul.allow_tf32", matmul, "allow_tf32"))
        return targets

    # ------------------------------------------------------------------ graphs
    def graph_api(self) -> tuple[Any, Any] | None:
        """``(Graph class, graph context manager)`` where whole-step capture exists, else None."""
        module = self.module
        if self.type not in ("cuda", "musa") or module is None:
            return None
        graph_cls = getattr(module, "CUDAGraph", None) or getattr(module, "MUSAGraph", None)
        graph_ctx = getattr(module, "graph", None)
        if graph_cls is None or graph_ctx is None:
            return None
        return graph_cls, graph_ctx

    def stream(self) -> Any:
        return self.module.Stream(self.torch_device)

    def current_stream(self) -> Any:
        return self.module.current_stream(self.torch_device)

    def use_stream(self, stream: Any) -> Any:
        """Context manager that makes ``stream`` current (``torch.cuda.stream`` / ``torch.musa.stream``)."""
        return self.module.stream(stream)

    def get_sync_debug_mode(self) -> int | None:
        """The current sync debug mode (0 off, 1 warn, 2 error); None where the backend has none."""
        fn = getattr(self.module, "get_sync_debug_mode", None) if self.module is not None else None
        return None if fn is None else int(fn())

    def set_sync_debug_mode(self, mode: str | int) -> None:
        """Make host-device synchronisations warn or raise (CUDA/MUSA)."""
        fn = getattr(self.module, "set_sync_debug_mode", None)
        if fn is None:
            raise DeviceError(f"{self.type} has no sync debug mode")
        fn(mode)

    # ------------------------------------------------------------------ distributed & env
    @property
    def collective_backend(self) -> str:
        return _COLLECTIVE.get(self.type, "gloo")

    @property
    def launch_blocking_var(self) -> str | None:
        return _LAUNCH_BLOCKING.get(self.type)

    @property
    def visible_devices_var(self) -> str | None:
        return _VISIBLE.get(self.type)

    def debug_env(self) -> dict[str, str | None]:
        """Environment variables that help find a failing op, with their current values."""
        names = [
            n
            for n in (self.launch_blocking_var, "TORCH_SHOW_CPP_STACKTRACES", self.visible_devices_var,
                      _ALLOC_CONF.get(self.type), *_EXTRA_DEBUG_ENV.get(self.type, ()))
            if n
        ]
        return {n: os.environ.get(n) for n in names}

    def rerun_hint(self) -> str:
        """The command-line prefix that makes device errors point at the failing op."""
        parts = [f"{self.launch_blocking_var}=1"] if self.launch_blocking_var else []
        parts.append("TORCH_SHOW_CPP_STACKTRACES=1")
        return " ".join(parts)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


def _package_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        module = importlib.import_module(name) if importlib.util.find_spec(name) else None
        return getattr(module, "__version__", None)


def _torch_at_least(major: int, minor: int) -> bool:
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)
