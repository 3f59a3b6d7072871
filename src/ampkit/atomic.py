"""Atomic writes (checkpoints, metrics, run records, the FP8 cost cache): a temp file beside the target, fsync, rename, fsync of the folder; ``kill -9`` at any
moment leaves the previous file intact."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "fsync_dir"]


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
