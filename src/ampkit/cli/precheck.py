"""Reject bad values before a command imports torch (seconds on a busy machine): one line, exit 2.

``main`` calls :func:`precheck` on the parsed arguments of every command. It checks only what needs no
torch and no task: numbers that must be positive, a task or callback file that does not exist, a
``diagnose`` script that is not there. The commands keep their own, fuller checks (the library's too):
this only makes the common mistakes fast. Nothing here imports torch (``tests/test_cli_fast.py``).
"""

from __future__ import annotations

import math
import os
from typing import Any

from ampkit.errors import UsageError

__all__ = ["precheck"]

# argparse dest -> the least value allowed (ints); None values are "not given".
_AT_LEAST = {
    "steps": 1, "seeds": 1, "log_every": 1, "accumulation_steps": 1, "ckpt_every": 1, "keep": 1,
    "stop_check_every": 1, "rounds": 1, "nproc": 1, "warmup": 0, "max_restarts": 0,
}
# argparse dest -> the flag's words, for floats that must be positive and finite.
_POSITIVE = ("lr", "init_scale")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_file(spec: Any, what: str) -> None:
    """``FILE.py:factory`` whose file is missing (``module:factory`` and built-in names are left to the loader)."""
    if not isinstance(spec, str):
        return
    mod_name, sep, _ = spec.rpartition(":")
    if sep and mod_name and (mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name) \
            and not os.path.isfile(mod_name):
        raise UsageError(f"{what} file {mod_name!r} does not exist")


def precheck(args: Any) -> None:
    """Raise a one-line :class:`~ampkit.errors.UsageError` for a value that can be judged without torch."""
    for dest, least in _AT_LEAST.items():
        value = getattr(args, dest, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            raise UsageError(f"{_flag(dest)} must be >= {least}, got {value}")
    for dest in _POSITIVE:
        value = getattr(args, dest, None)
        if isinstance(value, float) and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"{_flag(dest)} must be a positive number, got {value}")
    _check_file(getattr(args, "task", None), "task")
    model = getattr(args, "model", None)
    if getattr(args, "command", None) == "bench":
        _check_file(model, "task")
    for spec in getattr(args, "callback", None) or ():
        _check_file(spec, "callback")
    script = getattr(args, "script", None)
    if getattr(args, "command", None) == "diagnose" and isinstance(script, str) and not script.startswith("-") \
            and not os.path.isfile(script):
        raise UsageError(f"script not found: {script}")
