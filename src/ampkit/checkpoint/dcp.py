"""Checkpoints of a run on one or several processes: ampkit's one-file format, or sharded
``torch.distributed.checkpoint`` (DCP) folders for FSDP2, and resuming from the newest complete one
of either kind.

>>> ckpts = RunCheckpoints("runs/x/checkpoints", keep=3, ctx=ctx, sharded=True)    # doctest: +SKIP
>>> ckpts.save(step=100, model=model, optimizer=opt, amp=amp, device=device)       # doctest: +SKIP
>>> step, path, notes = ckpts.restore_latest(model=model, optimizer=opt, amp=amp, device=device)  # doctest: +SKIP

One file (``step-XXXXXXXX.pt``): rank 0 writes it (:mod:`ampkit.checkpoint`), every rank reads it.
Sharded (``step-XXXXXXXX.dcp/``): every rank writes its shards into ``.step-XXXXXXXX.dcp.tmp``,
rank 0 adds ``ampkit.pt`` (engine, RNG, step, scheduler) and renames the folder when every rank has
written, so a folder without its ``.metadata`` and ``ampkit.pt`` is never taken for a checkpoint.
DCP folders load on any number of ranks, or in one process without a process group.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from ampkit.checkpoint.rotation import is_good, last_good, mark_good, rotate
from ampkit.checkpoint.file import (FORMAT, CheckpointManager, atomic_write_bytes, fsync_dir, load_checkpoint, load_parts,
                               restore, restore_engine, rng_state)
from ampkit.device import Device
from ampkit.distributed.group import DistContext, active
from ampkit.distributed.wrap import unwrap
from ampkit.errors import CheckpointError, CheckpointMismatch, first_line

__all__ = ["RunCheckpoints", "is_complete_dcp"]


def _dcp_name(step: int) -> str:
    return f"step-{step:08d}.dcp"


def is_complete_dcp(path: Path) -> bool:
    """A sharded checkpoint folder that was renamed into place with its shards' index and ampkit's metadata."""
    return path.is_dir() and (path / ".metadata").is_file() and (path / "ampkit.pt").is_file()


class RunCheckpoints:
    """Checkpoints of a run (one process or several), in one folder.

    ``sharded=False``: ampkit's ``step-XXXXXXXX.pt`` files, written by rank 0 only.
    ``sharded=True``: ``step-XXXXXXXX.dcp/`` folders. Resuming reads the newest complete checkpoint of
    either kind (a ``.pt`` file cannot feed a model that FSDP2 has sharded; it is skipped with a note).
    ``scheduler`` (save and restore): the LR scheduler's state travels under the checkpoint's ``scheduler`` key.
    """

    def __init__(self, folder: str | os.PathLike, *, keep: int = 3, ctx: DistContext | None = None,
                 sharded: bool = False) -> None:
        self.files = CheckpointManager(folder, keep=keep)
        self.folder = Path(folder)
        self.keep = keep
        self.ctx = ctx
        self.sharded = sharded

    @property
    def _main(self) -> bool:
        return self.ctx is None or self.ctx.is_main

    @property
    def _world(self) -> int:
        return self.ctx.world_size if self.ctx else 1

    def _barrier(self) -> None:
        if self.ctx is not None:
            self.ctx.barrier()

    def list(self) -> list[tuple[int, Path]]:
        """Complete checkpoints of this run's kind, oldest first."""
        return self._dcp_list() if self.sharded else self.files.list()

    def _dcp_list(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        out = []
        for p in self.folder.iterdir():
            if p.name.startswith("step-") and p.name.endswith(".dcp") and is_complete_dcp(p):
                try:
                    out.append((int(p.name[5:-4]), p))
                except ValueError:
                    continue
        return sorted(out)

    def save(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
             scheduler: Any | None = None, extra: dict[str, Any] | None = None) -> Path:
        """Write the checkpoint of ``step`` (every rank calls this; it returns when the checkpoint is complete)."""
        extra = dict(extra or {})
        if not self.sharded:
            path = self.files.path_for(step)
            if self._main:
                path = self.files.save(step=step, model=unwrap(model), optimizer=optimizer, amp=amp, device=device,
                                       scheduler=scheduler, extra=extra)
            self._barrier()
            return path
        return self._save_dcp(step, model, optimizer, amp, device, scheduler, extra)

    def _save_dcp(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
                  scheduler: Any | None, extra: dict[str, Any]) -> Path:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = self.folder / _dcp_name(step)
        tmp = self.folder / f".{_dcp_name(step)}.tmp"
        if self._main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed mid-save
            tmp.mkdir(parents=True)
        self._barrier()
        msd, osd = get_state_dict(model, optimizer)
        try:
            with _quiet_without_group():
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
        except (Exception, _dcp_error()) as exc:  # noqa: BLE001 - dcp wraps OSErrors of any rank in its own type
            raise CheckpointError(f"cannot write checkpoint {final}: {first_line(exc, 200)}") from exc
        if self._main:
            # The engine's state first: it brings device-driven schedulers to their true position.
            amp_state = amp.state_dict() if amp is not None else None
            state = {"format": FORMAT, "version": 1, "step": int(step), "kind": "dcp", "amp": amp_state,
                     "scheduler": scheduler.state_dict() if scheduler is not None else None,
                     "rng": rng_state(device), "extra": extra, "world_size": self._world}
            atomic_write_bytes(tmp / "ampkit.pt", lambda fh: torch.save(state, fh))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.folder)
            if is_good(amp_state):
                mark_good(self.folder, step, final)
            rotate(self.list(), self.keep, self.folder, lambda old: shutil.rmtree(old, ignore_errors=True))
        self._barrier()
        return final

    def candidates(self) -> list[tuple[int, Path]]:
        """Every complete checkpoint of either kind, newest first; at the same step, the run's own kind first."""
        found = self.files.list() + self._dcp_list()
        return sorted(found, key=lambda sp: (sp[0], sp[1].suffix == (".dcp" if self.sharded else ".pt")),
                      reverse=True)

    def last_good(self) -> tuple[int, Path] | None:
        """``(step, path)`` of the newest checkpoint saved while no streak of skipped steps ran
        (:mod:`ampkit.checkpoint.rotation`); None when none is named or it is gone."""
        return last_good(self.folder)

    def restore(self, path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
                scheduler: Any | None = None) -> tuple[int, list[str]]:
        """Load the checkpoint at ``path`` (either kind) into the live objects: ``(step, notes)``."""
        notes: list[str] = []
        state = self._load(Path(path), model, optimizer, amp, device, scheduler, notes)
        return int(state["step"]), notes

    def restore_latest(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
                       scheduler: Any | None = None) -> tuple[int, Path | None, list[str]]:
        """Load the newest checkpoint that loads into the live objects: ``(step, path or None, notes)``.

        Unreadable checkpoints are skipped with a note; when checkpoints are there and none of them
        loads, a :class:`CheckpointError` says why (starting from scratch would train over the run);
        a checkpoint that reads well but belongs to another run is a :class:`CheckpointMismatch`."""
        notes: list[str] = []
        reasons: list[str] = []
        for _, path in self.candidates():
            if path.suffix == ".pt" and self.sharded and active():
                notes.append(f"skipped {path.name}: a one-file checkpoint cannot feed a sharded (fsdp) model")
                continue
            try:
                state = self._load(path, model, optimizer, amp, device, scheduler, notes)
            except CheckpointMismatch as exc:  # another run's checkpoint: never train over it from scratch
                raise CheckpointMismatch(f"{path} does not fit this run ({exc}): resume with the task, options "
                                         f"and optimizer it was trained with, or train into another --out") from exc
            except CheckpointError as exc:
                notes.append(f"skipped unreadable checkpoint: {exc}")
                reasons.append(str(exc))
                continue
            return int(state["step"]), path, notes
        if reasons or notes:
            why = reasons[0] if reasons else notes[0]
            raise CheckpointError(f"none of the checkpoints in {self.folder} loads ({why}): nothing was changed; "
                                  f"fix or move them away to start again, or train into another --out")
        return 0, None, notes

    def _load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
              scheduler: Any | None, notes: list[str]) -> dict[str, Any]:
        if path.suffix == ".pt":
            state = load_checkpoint(path, map_location=device.torch_device)
            notes += restore(state, model=unwrap(model), optimizer=optimizer, amp=amp, scheduler=scheduler,
                             device=device).notes
            return state
        meta = load_checkpoint(path / "ampkit.pt", map_location=device.torch_device)
        if meta.get("kind") != "dcp":
            raise CheckpointError(f"{path / 'ampkit.pt'} is not the metadata of a sharded checkpoint")
        _load_dcp(path, model, optimizer)
        notes += load_parts("scheduler", meta.get("scheduler"), scheduler)
        notes += restore_engine(meta, amp=amp, device=device)
        saved_world = meta.get("world_size", 1)
        if saved_world != self._world:
            notes.append(f"checkpoint written by {saved_world} rank(s), resharded onto {self._world}")
        return meta


def _load_dcp(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    target = unwrap(model)
    msd, osd = get_state_dict(target, optimizer)
    state = {"model": msd, "optim": osd}
    try:
        with _quiet_without_group():
            dcp.load(state, checkpoint_id=str(path))
    except (Exception, _dcp_error()) as exc:  # noqa: BLE001 - every rank reads the same files: all fail alike
        raise CheckpointError(f"cannot read checkpoint {path}: {first_line(exc, 200)}") from exc
    set_state_dict(target, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _dcp_error() -> type[BaseException]:
    """dcp's CheckpointException, which derives from BaseException: ``except Exception`` lets it through."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


@contextmanager
def _quiet_without_group() -> Iterator[None]:
    """dcp warns that it assumes one process when there is no process group: that is what we mean."""
    with warnings.catch_warnings():
        if not active():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield
