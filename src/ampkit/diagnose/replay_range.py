"""Which steps a recorded run took, so that ``diagnose --replay RUN_DIR:STEP`` refuses the others at once.

A replay past the run's last step would train steps the run never took (and a step far past it, for minutes
before anything is said): the last step is the halt's step when the run was halted, else the newest step its
``metrics.jsonl`` or its checkpoints record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError

__all__ = ["last_step_taken", "check_replay_step"]


def _last_logged(path: Path) -> int | None:
    """The ``step`` of the last whole line of ``metrics.jsonl`` (a line cut short by a kill is passed over)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def last_step_taken(out: Path, record: dict[str, Any], checkpoint_steps: list[int]) -> int | None:
    """The run's last optimizer step as its folder records it; None when nothing records one."""
    halt = record.get("halt") or {}
    if halt.get("step") is not None:
        return int(halt["step"])
    seen = [s for s in (_last_logged(out / "metrics.jsonl"), *checkpoint_steps) if s is not None]
    return max(seen) if seen else None


def check_replay_step(out: Path, record: dict[str, Any], checkpoint_steps: list[int], step: int | None) -> None:
    """A one-line UsageError when ``step`` is past the last step the run in ``out`` took (or the run recorded
    none): a replay rebuilds the run's own steps, it cannot invent new ones."""
    if step is None:
        return
    last = last_step_taken(out, record, checkpoint_steps)
    if last is None:
        raise UsageError(f"{out} records no step it took (no metrics.jsonl line, no checkpoint, no halt): it "
                         f"cannot replay step {step}; train it with --out {out} first")
    if step > last:
        raise UsageError(f"--replay {out}:{step}: the run's last step was {last}, so step {step} was never taken; "
                         f"give a step from 1 to {last} (or no step: its first bad step)")
