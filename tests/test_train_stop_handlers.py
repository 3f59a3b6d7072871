"""The trainer's stop request (:class:`ampkit.training.stop.StopRequest`) catches the stop signals only while
a loop runs: the handlers that were there before are put back, also after a signal was received."""

from __future__ import annotations

import os
import signal

from ampkit.training.stop import StopRequest


def _mine(signum, frame):
    pass


def test_installed_restores_the_previous_handlers():
    before = {s: signal.signal(s, _mine) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = StopRequest((signal.SIGINT, signal.SIGTERM))
        with stop.installed():
            assert signal.getsignal(signal.SIGTERM) is not _mine
            os.kill(os.getpid(), signal.SIGTERM)  # taken as a stop request, not by _mine
            assert stop.received == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is _mine and signal.getsignal(signal.SIGINT) is _mine
    finally:
        for s, h in before.items():
            signal.signal(s, h)
