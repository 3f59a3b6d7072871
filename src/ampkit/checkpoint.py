"""Checkpoints that are atomic, safe to load, and resume exactly.

One ``.pt`` file per checkpoint holds model, optimizer, the engine (scaler and counters), RNG
states (python, numpy, torch CPU and device), the step and the data position. Files are written
to a temporary name in the same folder, fsynced and renamed, so ``kill -9`` at any moment leaves
the previous checkpoint intact. Files are read with ``torch.load(weights_only=True)``: a file
that carries pickled code is refused.

>>> mgr = CheckpointManager("runs/x/checkpoints", keep=3)          # doctest: +SKIP
>>> mgr.save(step=100, model=model, optimizer=opt, amp=amp)        # doctest: +SKIP
>>> found = mgr.latest()                                            # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ampkit.device import Device
from ampkit.errors import CheckpointError, UsageError

__all__ = ["save_checkpoint", "load_checkpoint", "restore", "CheckpointManager", "Found", "rng_state",
           "set_rng_state", "atomic_write_bytes", "fsync_dir", "prepare_folder", "restore_engine"]

FORMAT = "ampkit-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step-(\d+)\.pt$")


def rng_state(device: Device | None = None) -> dict[str, Any]:
    """Every RNG state that affects training, in types ``weights_only`` loading accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    if device is not None and device.is_accelerator:
        state["device"] = device.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: Device | None = None) -> None:
    """Restore :func:`rng_state`. RNG states must be CPU byte tensors: a checkpoint loaded with
    ``map_location=<accelerator>`` carries them on the device, so they are brought back first."""
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))
    if device is not None and state.get("device") is not None and device.is_accelerator:
        device.set_rng_state(state["device"].cpu())


def _as_tuple(obj: Any) -> Any:
    return tuple(_as_tuple(o) for o in obj) if isinstance(obj, (list, tuple)) else obj


def atomic_write_bytes(path: str | os.PathLike, write: Any) -> Path:
    """Call ``write(fileobj)`` on a temp file beside ``path``, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)  # make the rename itself durable
    return path


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder so that a rename into it survives a crash; best effort (not every OS allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def prepare_folder(out: str | os.PathLike, flag: str = "--out") -> Path:
    """Create ``out`` if needed and check that files can be written there, before any work is done;
    a one-line :class:`UsageError` otherwise."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {out} exists and is not a folder: give a folder for metrics and checkpoints")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".ampkit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to {flag} {out}: {exc.strerror or exc}") from exc
    return path


def save_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    amp: Any | None = None, step: int, device: Device | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write one checkpoint atomically. ``extra`` must hold only tensors and plain python values.

    >>> model = torch.nn.Linear(2, 2)
    >>> path = ampkit.save_checkpoint("ckpt.pt", model=model, optimizer=None, step=7)
    >>> path.name
    'ckpt.pt'
    """
    state = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "amp": amp.state_dict() if amp is not None else None,
        "rng": rng_state(device),
        "extra": extra or {},
    }
    try:
        return atomic_write_bytes(path, lambda fh: torch.save(state, fh))
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from exc


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True``; any problem becomes a one-line :class:`CheckpointError`.

    >>> _ = ampkit.save_checkpoint("ckpt.pt", model=torch.nn.Linear(2, 2), optimizer=None, step=7)
    >>> state = ampkit.load_checkpoint("ckpt.pt")
    >>> state["format"], state["step"], sorted(state["model"])
    ('ampkit-checkpoint', 7, ['bias', 'weight'])
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint {path} does not exist") from exc
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise CheckpointError(f"refused {path}: it carries pickled code or objects, which ampkit never "
                                  f"loads (weights_only=True); re-save it from trusted code ({first[:120]})") from exc
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {first[:160]}") from exc
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {first[:160]}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an ampkit checkpoint")
    return state


def restore(state: dict[str, Any], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
            amp: Any | None = None, device: Device | None = None, rng: bool = True) -> list[str]:
    """Load a checkpoint's parts into live objects; returns notes (e.g. scaler dropped)."""
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    return restore_engine(state, amp=amp, device=device, rng=rng)


def restore_engine(state: dict[str, Any], *, amp: Any | None, device: Device | None = None,
                   rng: bool = True) -> list[str]:
    """The engine (scaler, counters) and RNG parts of a checkpoint; returns the engine's notes
    (returned, not warned: the caller reports them)."""
    notes: list[str] = []
    if amp is not None and state.get("amp") is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notes = amp.load_state_dict(state["amp"])
    if rng and state.get("rng") is not None:
        set_rng_state(state["rng"], device)
    return notes


@dataclass
class Found:
    """The newest loadable checkpoint, and the newer ones that were skipped as unreadable."""

    path: Path | None
    state: dict[str, Any] | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)


class CheckpointManager:
    """``step-00000100.pt`` files in one folder: atomic saves, keep the last ``keep``, find the newest good one."""

    def __init__(self, folder: str | os.PathLike, *, keep: int = 3) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.folder = Path(folder)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}.pt"

    def list(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        out = []
        for p in self.folder.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
        return sorted(out)

    def save(self, *, step: int, **kwargs: Any) -> Path:
        path = save_checkpoint(self.path_for(step), step=step, **kwargs)
        for _, old in self.list()[: -self.keep]:
            with contextlib.suppress(OSError):
                old.unlink()
        return path

    def latest(self, *, map_location: Any = "cpu") -> Found:
        """The newest checkpoint that loads; unreadable newer ones are reported in ``skipped``."""
        skipped: list[tuple[Path, str]] = []
        for _, path in reversed(self.list()):
            try:
                return Found(path, load_checkpoint(path, map_location=map_location), skipped)
            except CheckpointError as exc:
                skipped.append((path, str(exc)))
        return Found(None, None, skipped)
