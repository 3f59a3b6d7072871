"""The run record, ``DIR/run.json``: what a run of ``ampkit train`` was, next to its checkpoints, so that
``ampkit diagnose --replay DIR`` can rebuild it (task spec and options, precision, FP32 regions, seed,
engine settings, strategy, versions), and how it ended when it halted.

Written atomically by rank 0 when the run starts (after resume, so a refused resume leaves it as it was),
rewritten when the same run is resumed, and never over another run's: :func:`refuse_existing_run` stops
``--out`` on a folder that holds a run unless ``--resume`` asks to continue it.
The schema is in docs/reference/schemas.md.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ampkit.checkpoint import atomic_write_bytes
from ampkit.errors import UsageError

__all__ = ["RECORD", "FORMAT", "refuse_existing_run", "run_record", "write_record", "record_halt", "read_record",
           "task_spec", "config_fields"]

RECORD = "run.json"
FORMAT = "ampkit-run"
VERSION = 1
_RUN_FILES = (RECORD, "metrics.jsonl", "checkpoints", "tensorboard")


def refuse_existing_run(out: Path, *, resume: bool) -> None:
    """``--out`` on a folder that already holds a run, without ``--resume``: one line, exit 2, nothing touched.
    (A folder with other files, or an empty ``checkpoints/``, holds no run.)"""
    if resume or not out.is_dir():
        return
    found = [name for name in _RUN_FILES if _holds(out / name)]
    if found:
        raise UsageError(f"--out {out} already holds a run ({', '.join(found)}): continue it with --resume, or "
                         "give a fresh --out folder (nothing was changed)")


def _holds(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists()


def task_spec(spec: Any) -> str | None:
    """The task as a spec another process can load: built-in names and ``module:factory`` as given,
    ``FILE.py:factory`` with the file's absolute path; None for a task given as an object."""
    if not isinstance(spec, str):
        return None
    mod, sep, attr = spec.rpartition(":")
    if sep and (mod.endswith(".py") or "/" in mod or os.sep in mod):
        return f"{os.path.abspath(mod)}:{attr}"
    return spec


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run_record(run: Any, *, start: int, given_task: bool) -> dict[str, Any]:
    """The record of ``run`` (a :class:`~ampkit.training.setup.Run`) starting at step ``start``."""
    cfg = run.config
    spec = None if given_task else task_spec(cfg.task)
    why_not = None if spec is not None else ("the task was given to train() as an object, not as a spec "
                                             "another process can load")
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "start_step": start,
        "task": spec,
        "task_name": run.task.name,
        "task_options": dict(cfg.task_options),
        "precision": run.precision.name,
        "precision_requested": cfg.precision,
        "device": str(run.device),
        "seed": cfg.seed,
        "steps": run.total,
        "lr": cfg.lr,
        "max_grad_norm": cfg.max_grad_norm,
        "accumulation_steps": cfg.accumulation_steps,
        "fused": bool(run.optimizer.defaults.get("fused")),
        "tf32": cfg.tf32,
        "graph": run.graph_blocker is None,
        "fp8_recipe": cfg.fp8_recipe,
        "fp32_modules": run.amp.config.to_dict()["fp32_modules"],
        "fp32_regions": list(run.regions.names) if run.regions is not None else [],
        "engine": run.amp.config.to_dict(),
        "strategy": run.strategy,
        "world_size": run.world_size,
        "ckpt_every": cfg.ckpt_every,
        "keep": cfg.keep,
        "log_every": cfg.log_every,
        "callbacks": [cb if isinstance(cb, str) else type(cb).__name__ for cb in cfg.callbacks],
        "versions": {"ampkit": _version("ampkit"), "torch": torch.__version__,
                     "python": platform.python_version()},
        "replayable": why_not is None,
        "replay_blocker": why_not,
        "halt": None,
    }


def write_record(out: Path, record: dict[str, Any]) -> Path:
    data = (json.dumps(record, indent=2, default=str) + "\n").encode()
    return atomic_write_bytes(out / RECORD, lambda fh: fh.write(data))


def record_halt(out: Path, record: dict[str, Any], *, step: int, first_bad_step: int | None,
                last_good: tuple[int, Path] | None, message: str) -> None:
    """Add how the run halted to its record (rank 0, when the skip limit stopped it)."""
    record = dict(record)
    record["halt"] = {"step": step, "first_bad_step": first_bad_step, "message": message,
                      "last_good_step": last_good[0] if last_good else None,
                      "last_good_checkpoint": str(last_good[1]) if last_good else None}
    write_record(out, record)


def read_record(out: Path) -> dict[str, Any]:
    """The record of the run in ``out``; a one-line :class:`UsageError` when there is none or it is not one."""
    path = out / RECORD
    if not out.is_dir():
        raise UsageError(f"{out} is not a folder: give the --out folder of an `ampkit train` run")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{out} has no {RECORD}: replay needs the record that `ampkit train "
                         "--out DIR` writes at the start of a run (runs of older ampkit versions have none)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read as a run record: {exc}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UsageError(f"{path} is not an ampkit run record")
    if int(record.get("version", 0)) > VERSION:
        raise UsageError(f"{path} was written by a newer ampkit (record version {record.get('version')}): "
                         "upgrade ampkit (pip install -U ampkit)")
    return record


def config_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The :class:`TrainConfig` keywords that rebuild the recorded run (one process, no output folder)."""
    return {"task": record["task"], "task_options": dict(record.get("task_options") or {}),
            "precision": record["precision"], "seed": int(record.get("seed", 0)), "steps": record.get("steps"),
            "lr": record.get("lr"), "max_grad_norm": record.get("max_grad_norm"),
            "accumulation_steps": int(record.get("accumulation_steps", 1)), "fused": record.get("fused"),
            "tf32": record.get("tf32"), "fp8_recipe": record.get("fp8_recipe", "tensorwise"),
            "fp32_modules": tuple(record.get("fp32_modules") or ()) or None,
            "init_scale": (record.get("engine") or {}).get("init_scale"),
            "max_consecutive_skips": (record.get("engine") or {}).get("max_consecutive_skips", 50)}

