"""Where a run starts: step 0, or the newest complete checkpoint in ``--out`` (either kind)."""

from __future__ import annotations

from ampkit.training.setup import Run

__all__ = ["resume"]


def resume(run: Run) -> tuple[int, str | None]:
    """Restore the newest good checkpoint into ``run`` when asked (``--resume``, or a torchrun restart);
    returns ``(start step, checkpoint path or None)`` and adds what happened to ``run.notes``."""
    wanted = run.config.resume
    if run.ctx is not None and run.ctx.restart_count > 0 and run.ckpts is not None and not wanted:
        wanted = True  # torchrun restarted the job (--max-restarts): continue from the last checkpoint
        run.notes.append(f"torchrun restart {run.ctx.restart_count}: resuming from the last checkpoint")
    if not wanted or run.ckpts is None:
        return 0, None
    start, path, notes = run.ckpts.restore_latest(model=run.model, optimizer=run.optimizer, amp=run.amp,
                                                  device=run.device, scheduler=run.scheduler)
    run.notes.extend(notes)
    if path is None:
        run.notes.append(f"no checkpoint in {run.ckpts.folder}: starting from scratch")
        return 0, None
    run.notes.append(f"resumed from {path} at step {start}")
    return start, str(path)
