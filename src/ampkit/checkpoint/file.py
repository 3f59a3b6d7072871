"""Checkpoints that are atomic, safe to load, and resume exactly.

One ``.pt`` file per checkpoint holds model, optimizer(s), LR scheduler(s), the engine (scaler and
counters), RNG states (python, numpy, torch CPU and device), the step and ``extra`` (e.g. the data
position). Files are written to a temporary name in the same folder, fsynced and renamed, so
``kill -9`` at any moment leaves the previous checkpoint intact. Files are read with
``torch.load(weights_only=True)``: a file that carries pickled code is refused, and
:func:`save_checkpoint` refuses at save time any value that such a load would refuse.

>>> ampkit.save_checkpoint("ckpt.pt", model=model, optimizer=opt, amp=amp, scheduler=sched, step=100)  # doctest: +SKIP
>>> r = ampkit.restore("ckpt.pt", model=model, optimizer=opt, amp=amp, scheduler=sched)  # doctest: +SKIP
>>> r.step, r.notes                                                                        # doctest: +SKIP

Errors: :class:`~ampkit.errors.CheckpointError` for anything about a checkpoint (a file that is
missing, corrupt, unsafe, not ampkit's, from a newer ampkit, or that does not fit the objects given;
a value that cannot be saved loadably; a save in the middle of an accumulation window);
:class:`~ampkit.errors.UsageError` when the call itself is wrong (an argument of the wrong type, ``keep < 1``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ampkit.atomic import atomic_write_bytes, fsync_dir
from ampkit.checkpoint.rotation import is_good, last_good, mark_good, rotate
from ampkit.checkpoint.content import check_loadable, check_module, load_model_state, model_state, some_keys, unwrap_model
from ampkit.device import Device, parse_device
from ampkit.errors import AmpkitError, CheckpointError, CheckpointMismatch, UsageError, in_chain

__all__ = ["save_checkpoint", "load_checkpoint", "restore", "Restored", "CheckpointManager", "Found", "rng_state",
           "set_rng_state", "atomic_write_bytes", "fsync_dir", "prepare_folder", "restore_engine", "load_parts", "unwrap_model",
           "check_loadable"]

FORMAT = "ampkit-checkpoint"
VERSION = 2  # 2: optional "scheduler"; "optimizer"/"scheduler" may be lists
_NAME = re.compile(r"^step-(\d+)\.pt$")


# ---------------------------------------------------------------------------- RNG
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


def _device_of(model: nn.Module, amp: Any | None) -> Device | None:
    """Whose RNG to save and restore besides the CPU's: the engine's device, else the model's."""
    if amp is not None and isinstance(getattr(amp, "device", None), Device):
        return amp.device
    param = next(iter(model.parameters()), None)
    if param is None:
        return None
    try:
        return parse_device(str(param.device))
    except AmpkitError:  # e.g. a meta tensor: no RNG to keep
        return None


# ---------------------------------------------------------------------------- files
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


# ---------------------------------------------------------------------------- save / load
Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None
Schedulers = Any  # an LR scheduler, a list of them, or None


def _states(objs: Any) -> Any:
    """``obj.state_dict()``, or a list of them for a list of objects, or None."""
    if objs is None:
        return None
    if isinstance(objs, (list, tuple)):
        return [o.state_dict() for o in objs]
    return objs.state_dict()


def _check_window(amp: Any, amp_state: dict[str, Any], step: int) -> None:
    """Refuse a save between the micro-steps of an accumulation window: the partial gradients are not
    in the checkpoint, so the resumed run would differ from an uninterrupted one."""
    pending = int(amp_state.get("window", 0))  # micro-steps since the last update (MixedPrecision.accumulation_pending)
    if pending:
        window = amp.accumulation_steps
        raise CheckpointError(
            f"step {step}: saved in the middle of an accumulation window ({pending} of {window} micro-steps "
            f"done): the partial gradients are not saved, so a resume would differ; save right after the "
            f"amp.step() call that ends a window (one in every {window} calls)")


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer: Optimizers, amp: Any | None = None,
                    step: int, device: Device | None = None, extra: dict[str, Any] | None = None,
                    scheduler: Schedulers = None) -> Path:
    """Write one checkpoint atomically (temp file, fsync, rename, fsync of the folder).

    ``optimizer`` and ``scheduler`` may be lists (several optimizers in one engine); :func:`restore`
    wants the same number back. Compiled and DDP wrappers are unwrapped: the file holds the plain
    module's names. ``extra`` must hold only tensors and plain python values. ``device``: whose RNG
    to save besides the CPU's (default: the engine's device, else the model's).

    Refused with one :class:`CheckpointError` line, before anything is written: a value that
    ``torch.load(weights_only=True)`` would refuse (naming its key), and a save in the middle of an
    accumulation window.

    >>> model = torch.nn.Linear(2, 2)
    >>> path = ampkit.save_checkpoint("ckpt.pt", model=model, optimizer=None, step=7)
    >>> path.name
    'ckpt.pt'
    """
    state = checkpoint_state(model=model, optimizer=optimizer, amp=amp, step=step, device=device, extra=extra,
                             scheduler=scheduler)
    return write_state(path, state)


def checkpoint_state(*, model: nn.Module, optimizer: Optimizers, amp: Any | None = None, step: int,
                     device: Device | None = None, extra: dict[str, Any] | None = None,
                     scheduler: Schedulers = None) -> dict[str, Any]:
    """What :func:`save_checkpoint` writes, checked to load with ``weights_only=True``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UsageError(f"step must be a non-negative int, got {step!r}")
    # The engine's state first: it brings schedulers it drives on the device to their true position, so the
    # scheduler states saved next are current (before it, their last_epoch lags the applied steps).
    amp_state = amp.state_dict() if amp is not None else None
    if amp_state is not None:
        _check_window(amp, amp_state, step)
    state = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "model": model_state(model),
        "optimizer": _states(optimizer),
        "scheduler": _states(scheduler),
        "amp": amp_state,
        "rng": rng_state(device or _device_of(model, amp)),
        "extra": extra or {},
    }
    for key, value in state.items():
        check_loadable(value, key)
    return state


def write_state(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write a :func:`checkpoint_state` atomically; a one-line :class:`CheckpointError` when it cannot."""
    try:
        return atomic_write_bytes(path, lambda fh: torch.save(state, fh))
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from exc
    except RuntimeError as exc:  # torch's zip writer hides the disk's OSError behind its own error when it closes
        cause = in_chain(exc, OSError)
        if cause is None:
            raise
        raise CheckpointError(f"cannot write checkpoint {path}: {cause.strerror or cause}") from exc


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True``; any problem becomes a one-line :class:`CheckpointError`,
    and a plain ``torch.save`` file gets a message that says how to use it.

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
    except IsADirectoryError as exc:
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file") from exc
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise CheckpointError(f"refused {path}: it carries pickled code or objects, which ampkit never "
                                  f"loads (weights_only=True); re-save it from trusted code ({first[:120]})") from exc
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {first[:160]}") from exc
    except Exception as exc:  # noqa: BLE001 - a torn file makes the unpickler fail in many ways (IndexError, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {first[:160]}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(_not_ampkit(path, state))
    version = state.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
        raise CheckpointError(f"{path} was written by a newer ampkit (checkpoint format {version}; this one reads "
                              f"up to {VERSION}): upgrade ampkit (pip install -U ampkit)")
    return state


def _not_ampkit(path: Path, state: Any) -> str:
    load = f"torch.load({str(path)!r}, weights_only=True)"
    if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
        return (f"{path} is a model state_dict ({len(state)} tensors), not an ampkit checkpoint: load it with "
                f"model.load_state_dict({load}), or ampkit.restore({load}, model=model)")
    if isinstance(state, dict):
        keys = ", ".join(repr(k) for k in list(state)[:6]) + (", ..." if len(state) > 6 else "")
        return (f"{path} is a plain torch checkpoint (a dict with keys {keys}), not an ampkit checkpoint: "
                f"restore it with ampkit.restore({load}, model=model, optimizer=optimizer) or load its parts "
                f"with model.load_state_dict(...); it has no RNG state, so save with ampkit.save_checkpoint "
                f"for an exact resume")
    return f"{path} is not an ampkit checkpoint (it holds a {type(state).__name__}, not a dict)"


# ---------------------------------------------------------------------------- restore
@dataclass(frozen=True)
class Restored:
    """What :func:`restore` did: ``step`` to continue from, ``notes`` worth telling the user (e.g. a
    scaler dropped on a precision change, a part the checkpoint lacks), the checkpoint's ``extra``,
    and ``path`` (None when a state dict was given)."""

    step: int
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


# A plain torch checkpoint's usual names for each part (the tutorials' *_state_dict names included).
_PLAIN_KEYS = {"model": ("model", "model_state_dict"), "optimizer": ("optimizer", "optimizer_state_dict"),
               "scheduler": ("scheduler", "scheduler_state_dict", "lr_scheduler"),
               "scaler": ("scaler", "scaler_state_dict")}


def restore(path_or_state: str | os.PathLike | dict[str, Any], *, model: nn.Module, optimizer: Optimizers = None,
            amp: Any | None = None, scheduler: Schedulers = None, device: Device | None = None,
            rng: bool = True) -> Restored:
    """Load a checkpoint into live objects: model, optimizer(s), scheduler(s), the engine, and the RNG,
    so that training continues exactly as if it had never stopped (bit for bit on the CPU).

    ``path_or_state``: a file from :func:`save_checkpoint`, the dict :func:`load_checkpoint` returns,
    or a plain torch state dict (``{"model": ..., "optimizer": ...}`` or a model's ``state_dict()``;
    those carry no RNG, and a note says so). ``optimizer`` and ``scheduler`` may be lists, as saved.
    Wrapped models (``torch.compile``, DDP) load plain checkpoints and the other way round.

    >>> r = ampkit.restore("ckpt.pt", model=model, optimizer=opt, amp=amp)  # doctest: +SKIP
    >>> for step in range(r.step, total): ...                                 # doctest: +SKIP
    """
    check_module(model)
    path: Path | None = None
    if isinstance(path_or_state, (str, os.PathLike)):
        path = Path(path_or_state)
        state = load_checkpoint(path, map_location=_map_location(model))
    elif isinstance(path_or_state, dict):
        state = path_or_state
    else:
        raise UsageError(f"restore takes a checkpoint path or a state dict, got {type(path_or_state).__name__}")
    if state.get("format") != FORMAT:
        return _restore_plain(state, model=model, optimizer=optimizer, amp=amp, scheduler=scheduler)
    load_model_state(model, state["model"])
    master = getattr(amp, "master", None)
    saved_amp = state.get("amp") or {}
    if master is not None and saved_amp.get("remainders"):
        master.load_state_dict(saved_amp["remainders"])  # before the optimizer: its states are loaded as FP32
    with amp.exact_weights() if master is not None else contextlib.nullcontext():
        notes = load_parts("optimizer", state.get("optimizer"), optimizer)  # torch casts states to the params' dtype
    notes += load_parts("scheduler", state.get("scheduler"), scheduler)
    if amp is not None and state.get("amp") is None:
        notes.append("the checkpoint has no engine state: the engine starts fresh")
    notes += restore_engine(state, amp=amp, device=device or _device_of(model, amp), rng=rng)
    return Restored(step=int(state["step"]), notes=tuple(notes), extra=dict(state.get("extra") or {}), path=path)


def _map_location(model: nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    return param.device if param is not None and param.device.type != "meta" else torch.device("cpu")


def load_parts(name: str, saved: Any, live: Any) -> list[str]:
    """Load one saved state dict (or a list of them) into ``live`` (one object or a list); counts must match."""
    if live is None:
        return [f"the checkpoint's {name} state was not restored (no {name} given)"] if saved is not None else []
    if saved is None:
        return [f"the checkpoint has no {name} state: the {name} starts fresh"]
    saved_list = saved if isinstance(saved, list) else [saved]
    live_list = list(live) if isinstance(live, (list, tuple)) else [live]
    if len(saved_list) != len(live_list):
        raise CheckpointMismatch(f"the checkpoint has {len(saved_list)} {name}(s), {len(live_list)} given: "
                                 f"pass them in a list, in the order they were saved")
    for i, (obj, sd) in enumerate(zip(live_list, saved_list)):
        try:
            obj.load_state_dict(sd)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            which = f"{name} {i}" if len(live_list) > 1 else name
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointMismatch(f"the checkpoint's {which} state does not fit {type(obj).__name__}: "
                                     f"{first[:160]}") from exc
    return []


def _restore_plain(state: dict[str, Any], *, model: nn.Module, optimizer: Optimizers, amp: Any | None,
                   scheduler: Schedulers) -> Restored:
    """A dict that is not an ampkit checkpoint: ``{"model": ..., "optimizer": ..., ...}`` or a bare model state_dict."""
    if state and all(isinstance(v, torch.Tensor) for v in state.values()):
        load_model_state(model, state)
        return Restored(step=0, notes=("a model state_dict: only the model was restored (no optimizer, "
                                       "engine or RNG state in it)",))
    parts = {name: next((state[k] for k in keys if k in state), None) for name, keys in _PLAIN_KEYS.items()}
    if not isinstance(parts["model"], dict):
        raise CheckpointError("restore got a dict that is neither an ampkit checkpoint, nor a plain checkpoint "
                              "with a 'model' state dict, nor a model state_dict; keys: " + some_keys(list(map(str, state))))
    load_model_state(model, parts["model"])
    notes = load_parts("optimizer", parts["optimizer"], optimizer)
    notes += load_parts("scheduler", parts["scheduler"], scheduler)
    scaler = getattr(amp, "scaler", None) if amp is not None else None
    if parts["scaler"] is not None and scaler is not None:
        scaler.load_state_dict(parts["scaler"])
    elif parts["scaler"] is not None and amp is not None:
        notes.append("the checkpoint's loss scaler state was dropped: this engine's precision needs no scaler")
    notes.append("not an ampkit checkpoint: no RNG state was restored, so dropout and sampling differ from an "
                 "uninterrupted run; save with ampkit.save_checkpoint for an exact resume")
    step = state.get("step", 0)
    return Restored(step=int(step) if isinstance(step, int) else 0, notes=tuple(notes))


def restore_engine(state: dict[str, Any], *, amp: Any | None, device: Device | None = None,
                   rng: bool = True) -> list[str]:
    """The engine (scaler, counters) and RNG parts of a checkpoint; returns the engine's notes
    (returned, not warned: the caller reports them)."""
    notes: list[str] = []
    if amp is not None and state.get("amp") is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notes = list(amp.load_state_dict(state["amp"]) or [])
    if rng and state.get("rng") is not None:
        set_rng_state(state["rng"], device)
    return notes


# ---------------------------------------------------------------------------- a folder of checkpoints
def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


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
            raise UsageError(f"keep must be >= 1, got {keep}")
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
        """:func:`save_checkpoint` to ``path_for(step)`` (same keywords), then drop all but the newest ``keep``
        and the last good one (:mod:`ampkit.checkpoint.rotation`)."""
        state = checkpoint_state(step=step, **kwargs)
        path = write_state(self.path_for(step), state)
        if is_good(state["amp"]):
            mark_good(self.folder, step, path)
        rotate(self.list(), self.keep, self.folder, _unlink)
        return path

    def last_good(self) -> tuple[int, Path] | None:
        """``(step, path)`` of the newest checkpoint saved while no streak of skipped steps ran."""
        return last_good(self.folder)

    def latest(self, *, map_location: Any = "cpu") -> Found:
        """The newest checkpoint that loads; unreadable newer ones are reported in ``skipped``."""
        skipped: list[tuple[Path, str]] = []
        for _, path in reversed(self.list()):
            try:
                return Found(path, load_checkpoint(path, map_location=map_location), skipped)
            except CheckpointError as exc:
                skipped.append((path, str(exc)))
        return Found(None, None, skipped)
