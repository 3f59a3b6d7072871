"""Which checkpoints a run keeps: the newest ``keep``, and the last good one.

A checkpoint is *good* when the engine's consecutive-skip counter, as saved in it, is 0: the last step
before the save was applied, so no streak of skipped (non-finite) steps was under way. Every checkpoint
saved during a streak has a counter above 0, so the newest good checkpoint is always from before the
streak that is running now (or that halted the run), however long it lasts. The counter is the one
:meth:`MixedPrecision.state_dict` reads for the checkpoint anyway: deciding costs no host read, and the
steps between checkpoints read nothing.

The last good checkpoint is named in ``last-good.json`` in the checkpoint folder (written atomically
after the checkpoint itself), and rotation never deletes it: while the run is healthy it is simply the
newest checkpoint; once a streak begins it stays, while the ``keep`` newest rotate past it.
A checkpoint saved without an engine state (no counters) counts as good: there is nothing to say otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ampkit.atomic import atomic_write_bytes

__all__ = ["GOOD_FILE", "streak_at_save", "is_good", "mark_good", "last_good", "rotate"]

GOOD_FILE = "last-good.json"


def streak_at_save(amp_state: dict[str, Any] | None) -> int | None:
    """The consecutive skipped steps recorded in an engine state (None: no engine or no counters yet)."""
    counters = (amp_state or {}).get("counters")
    if counters is None:
        return None
    return int(counters[1])


def is_good(amp_state: dict[str, Any] | None) -> bool:
    streak = streak_at_save(amp_state)
    return streak is None or streak == 0


def mark_good(folder: Path, step: int, path: Path) -> None:
    """Name ``path`` (checkpoint of ``step``) the folder's last good checkpoint, atomically."""
    data = json.dumps({"step": int(step), "name": path.name}).encode()
    atomic_write_bytes(folder / GOOD_FILE, lambda fh: fh.write(data))


def last_good(folder: Path) -> tuple[int, Path] | None:
    """``(step, path)`` of the last good checkpoint named in ``folder``, when it is still there."""
    try:
        info = json.loads((folder / GOOD_FILE).read_text(encoding="utf-8"))
        step, name = int(info["step"]), str(info["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = folder / os.path.basename(name)
    return (step, path) if path.exists() else None


def rotate(entries: list[tuple[int, Path]], keep: int, folder: Path, remove: Callable[[Path], None]) -> None:
    """Remove all but the newest ``keep`` of ``entries`` (oldest first), sparing the last good checkpoint."""
    good = last_good(folder)
    spared = good[1] if good is not None else None
    for _, old in entries[:-keep]:
        if spared is None or old.name != spared.name:
            remove(old)
