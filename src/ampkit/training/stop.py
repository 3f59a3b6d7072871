"""Stopping on a signal without losing work: finish the step, agree on it across ranks, save, exit.

One process: SIGINT/SIGTERM (and ``stop_signal``) set a flag that the loop reads after every step
(a host variable: no device read).

Several processes: a rank's signal arrives at its own moment, but every rank has to stop after the
same step, or the final checkpoint's collectives would wait forever. Every ``check_every`` steps
each rank writes its flag (0, or the signal's number) into a one-element device tensor and the ranks
all_reduce it (MAX): on those steps only, the loop reads that tensor, so ordinary steps make no host
sync and a stop takes effect at most ``check_every`` steps after the signal. The agreed number is the
job's signal, on every rank, even on ranks that got none.

A second signal stops the process at once (the previous handler runs: SIGINT raises
KeyboardInterrupt, SIGTERM ends the process), unless it comes within ``GRACE_S`` of the first:
torchrun forwards a signal to its workers, and a terminal or scheduler that signals the whole
process group makes them receive it twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator

import torch

from ampkit.errors import UsageError

__all__ = ["StopRequest", "parse_signal", "GRACE_S"]

GRACE_S = 2.0


def parse_signal(name: str) -> signal.Signals:
    """``"SIGUSR1"``, ``"USR1"`` or ``"10"`` -> ``signal.SIGUSR1``; a one-line UsageError otherwise."""
    raw = name.strip().upper()
    try:
        sig = signal.Signals(int(raw)) if raw.isdigit() else signal.Signals[raw if raw.startswith("SIG") else "SIG" + raw]
    except (KeyError, ValueError):
        raise UsageError(f"--stop-signal {name!r} is not a signal here: use a name such as SIGUSR1 or USR2") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise UsageError(f"--stop-signal {sig.name} cannot be caught by any process: use SIGUSR1, SIGUSR2 or SIGTERM")
    return sig


class StopRequest:
    """The stop flag of one run. ``signals``: the signal numbers that ask for a graceful stop."""

    def __init__(self, signals: tuple[int, ...], *, ctx: Any = None, check_every: int = 10,
                 device: torch.device | None = None) -> None:
        self.signals = signals
        self.ctx = ctx if ctx is not None and ctx.world_size > 1 else None
        self.check_every = check_every
        self.received: int | None = None  # this process's first signal
        self.agreed: int | None = None  # the signal every rank stops for
        self._at = 0.0
        self._flag = torch.zeros(1, dtype=torch.int32, device=device) if self.ctx is not None else None

    @property
    def name(self) -> str | None:
        """The agreed signal's name (``"SIGTERM"``), or None while running."""
        return signal.Signals(self.agreed).name if self.agreed else None

    def should_stop(self, step: int) -> bool:
        """Called after optimizer step ``step`` on every rank; True on the same step on all of them."""
        if self.agreed:
            return True
        if self.ctx is None:
            self.agreed = self.received
            return self.agreed is not None
        if step % self.check_every:
            return False
        self._flag.fill_(self.received or 0)
        self.ctx.max_(self._flag)
        agreed = int(self._flag.item())  # the one host read, every check_every steps
        self.agreed = agreed or None
        return self.agreed is not None

    def _handler(self, signum: int, _frame: Any, previous: dict[int, Any]) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self._at = signum, now
            return
        if now - self._at < GRACE_S:
            return  # the same request, delivered twice (launcher + process group)
        signal.signal(signum, previous.get(signum) or signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # stop now: the previous handler (or the default action) takes it

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopRequest"]:
        """Catch the stop signals while the loop runs (main thread only; elsewhere signals are not ours)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous: dict[int, Any] = {}
        for sig in self.signals:
            previous[sig] = signal.signal(sig, lambda s, f: self._handler(s, f, previous))
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
