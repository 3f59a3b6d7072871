"""Typed errors. Each carries a one-line, actionable message and the exit code the CLI uses."""

from __future__ import annotations

__all__ = [
    "AmpkitError",
    "UsageError",
    "DeviceError",
    "PrecisionUnsupported",
    "CheckpointError",
    "TrainingHalted",
    "first_line",
]


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """``"Type: first line of the message"`` (at most ``limit`` characters of it), or ``"Type"``:
    how an exception from torch, a driver or a user's script is quoted in a one-line message."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    if limit is not None:
        line = line[:limit]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


class AmpkitError(Exception):
    """Base class: the message is what a person reads; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(AmpkitError, ValueError):
    """Bad input from the user (a flag value, a path, a task name)."""

    exit_code = 2


class DeviceError(UsageError):
    """A device was requested that does not exist or is not available here."""


class PrecisionUnsupported(AmpkitError, ValueError):
    """An explicit precision request the device cannot honour. The message names the card and the fix."""

    exit_code = 1


class CheckpointError(AmpkitError):
    """A checkpoint cannot be written or read safely."""


class TrainingHalted(AmpkitError, RuntimeError):
    """Training stopped on purpose (e.g. too many consecutive non-finite steps)."""
