"""A comparison a stop signal cut short is not judged (no verdict, nothing written), and the signal handlers
that were there before are there again afterwards. In-process and fast: the real trainer on the toy task, a
real SIGTERM sent to this process from the progress callback (the slow twin, test_compare_signals.py, drives
the CLI in a subprocess)."""

from __future__ import annotations

import os
import signal

import pytest

import ampkit
from ampkit.verify.interrupt import Interrupted, finished, stop_on_signals
from task_specs import TOY


def _mine(signum, frame):  # a handler of the caller's own, to be found in place afterwards
    pass


@pytest.fixture
def own_handlers():
    before = {s: signal.signal(s, _mine) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def test_a_comparison_stopped_by_a_signal_gets_no_verdict(tmp_path, own_handlers):
    events = []

    def progress(ev):
        events.append(ev)
        if ev.get("event") == "log" and ev.get("run") == 1 and ev.get("step") == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as info, stop_on_signals():
        ampkit.compare(TOY, precision="bf16", seeds=2, steps=40, log_every=1, device="cpu", run_audit=False,
                       out=tmp_path / "c", graph=False, progress=progress)
    assert info.value.exit_code == 128 + signal.SIGTERM and "SIGTERM" in str(info.value)
    assert not (tmp_path / "c" / "compare.json").exists() and not (tmp_path / "c" / "report.html").exists()
    assert [e["run"] for e in events if e.get("event") == "run_start"] == [1]  # no further run started
    assert signal.getsignal(signal.SIGTERM) is _mine and signal.getsignal(signal.SIGINT) is _mine


def test_finished_refuses_a_stopped_result():
    class Result:
        interrupted_by = "SIGINT"
        steps = 3

    with pytest.raises(Interrupted, match="SIGINT"):
        finished(Result())
    done = type("Done", (), {"interrupted_by": None})()
    assert finished(done) is done


def test_stop_on_signals_restores_the_previous_handlers(own_handlers):
    with stop_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not _mine
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before os.kill returns
    assert signal.getsignal(signal.SIGTERM) is _mine and signal.getsignal(signal.SIGINT) is _mine
