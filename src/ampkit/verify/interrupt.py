"""A stop signal ends the whole comparison: nothing cut short is ever judged as a finished run.

``compare`` (and ``--explain``) train many runs one after the other. The trainer catches SIGINT and SIGTERM to
stop a run gracefully after its current step (``TrainResult.interrupted_by``); a comparison must not then go on
and judge that short run's last training loss as the task's metric. :func:`finished` is called on every
trainer result of a comparison and raises :class:`Interrupted` for one that a signal stopped;
:func:`stop_on_signals` (installed by ``ampkit compare``) turns a signal that arrives between runs (evaluation,
the audit, writing the report) into the same exception. ``Interrupted`` derives from :class:`BaseException`,
like :class:`KeyboardInterrupt`, so no ``except Exception`` on the way (the audit, explain's reruns) can
swallow it; the CLI prints one line and exits 128 + the signal's number, and no verdict is written.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

__all__ = ["Interrupted", "finished", "stop_on_signals"]


class Interrupted(BaseException):
    """A signal stopped the comparison; ``exit_code`` is the shell's 128 + N."""

    def __init__(self, signum: int, where: str = "") -> None:
        self.signum = int(signum)
        self.name = signal.Signals(self.signum).name
        self.where = where
        super().__init__(f"stopped by {self.name}" + (f" {where}" if where else ""))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def finished(result: Any, where: str = "") -> Any:
    """``result`` (a :class:`~ampkit.training.trainer.TrainResult`) if its run ran to the end; :class:`Interrupted`
    if a signal stopped it."""
    name = getattr(result, "interrupted_by", None)
    if name:
        raise Interrupted(signal.Signals[name], where or f"during a run (at step {getattr(result, 'steps', '?')})")
    return result


@contextlib.contextmanager
def stop_on_signals(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While inside, a stop signal raises :class:`Interrupted` (the trainer's own handler takes over during a
    training loop and hands the stop back through :func:`finished`). Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_it(signum: int, _frame: Any) -> None:
        raise Interrupted(signum, "between runs")

    previous = {sig: signal.signal(sig, raise_it) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
