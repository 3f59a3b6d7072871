"""Typed errors. Each carries a one-line, actionable message and the exit code the CLI uses."""

from __future__ import annotations

__all__ = [
    "AmpkitError",
    "UsageError",
    "DeviceError",
    "PrecisionUnsupported",
    "CheckpointError",
    "CheckpointMismatch",
    "TrainingHalted",
    "first_line",
    "in_chain",
]


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """``"Type: first line of the message"`` (at most ``limit`` characters of it), or ``"Type"``:
    how an exception from torch, a driver or a user's script is quoted in a one-line message."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    if limit is not None:
        line = line[:limit]
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def in_chain(exc: BaseException | None, kind: type) -> BaseException | None:
    """The ``kind`` exception in ``exc``'s chain (itself, its ``__cause__``, or what it was raised while handling),
    or None: how an error hidden behind a library's own (torch's zip writer, a signal in torchrun) is found."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class AmpkitError(Exception):
    """Base class: the message is what a person reads; ``exit_code`` is what the CLI returns.

    >>> issubclass(ampkit.TrainingHalted, ampkit.AmpkitError), ampkit.AmpkitError("x").exit_code
    (True, 1)
    """

    exit_code = 1


class UsageError(AmpkitError, ValueError):
    """Bad input from the user (a flag value, a path, a task name).

    >>> ampkit.load_task("no-such-task")
    Traceback (most recent call last):
    ampkit.errors.UsageError: ...
    >>> ampkit.UsageError("x").exit_code
    2
    """

    exit_code = 2


class DeviceError(UsageError):
    """A device was requested that does not exist or is not available here."""


class PrecisionUnsupported(AmpkitError, ValueError):
    """An explicit precision request the device cannot honour. The message names the card and the fix.

    >>> try:                                             # doctest: +SKIP
    ...     ampkit.resolve_precision("bf16")             # on an MTT S80, which has FP16 only
    ... except ampkit.PrecisionUnsupported as exc:
    ...     print(exc)
    MTT S80 (QY1, capability 2.1) supports FP16 only: use --precision fp16 ...
    """

    exit_code = 1


class CheckpointError(AmpkitError):
    """A checkpoint cannot be written or read safely.

    >>> ampkit.load_checkpoint("missing.pt")
    Traceback (most recent call last):
    ampkit.errors.CheckpointError: checkpoint missing.pt does not exist
    """


class CheckpointMismatch(CheckpointError):
    """A checkpoint that reads well but does not fit the objects given (another model, optimizer, count).

    Resuming skips checkpoints that cannot be read (a torn last file) but stops at one of these: starting
    from scratch would overwrite the run's checkpoints with another run's.

    >>> import torch
    >>> ampkit.restore({"model": torch.nn.Linear(2, 2).state_dict()}, model=torch.nn.Linear(3, 3))
    Traceback (most recent call last):
    ampkit.errors.CheckpointMismatch: the checkpoint's model does not fit Linear: size mismatch for weight: ...
    """


class TrainingHalted(AmpkitError, RuntimeError):
    """Training stopped on purpose (e.g. too many consecutive non-finite steps).

    Raised by :meth:`ampkit.MixedPrecision.stats` after ``max_consecutive_skips`` skipped steps in a row:

    >>> try:                                              # doctest: +SKIP
    ...     stats = amp.stats()
    ... except ampkit.TrainingHalted as exc:
    ...     print(exc)        # 50 optimizer steps in a row had non-finite gradients ... ampkit diagnose SCRIPT

    ``step``: the optimizer steps done when it stopped; ``first_bad_step``: the first skipped step of the
    streak, where the read that halted also saw the streak's length (else None). ``ampkit train`` adds the
    last good checkpoint and ``ampkit diagnose --replay DIR`` to the message.
    """

    def __init__(self, message: str = "", *, step: int | None = None, first_bad_step: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.first_bad_step = first_bad_step
