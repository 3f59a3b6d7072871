"""A stopped `ampkit compare SCRIPT` stops the script's process and all it started, and says so in one line.

Real processes and real signals: the CLI runs in a subprocess on a script that never ends by itself
(tests/verify/scripts/endless_loop.py, which also starts a helper process, as a data loader's worker would);
the signal comes once the script runs. ``ps`` (psutil) then must find none of the tree.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from proctree import alive, descendants, kill_all, start_cli, wait_gone, wait_until

SCRIPT = str(Path(__file__).parent / "scripts" / "endless_loop.py")


def _start(tmp_path):
    pidfile = tmp_path / "helper.pid"
    proc = start_cli("compare", "--seeds", "1", "--no-audit", "--out", str(tmp_path / "cmp"), SCRIPT,
                     str(pidfile), cwd=tmp_path)
    helper = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 120, "the script to start")
    tree = [p.pid for p in descendants(proc.pid)] + [int(helper)]
    assert any("script_run" in " ".join(p.cmdline()) for p in descendants(proc.pid)), "no script_run child"
    return proc, tree


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                 pytest.param(signal.SIGHUP, marks=pytest.mark.slow)], ids=lambda s: s.name)
def test_a_stop_signal_stops_the_script_and_what_it_started(tmp_path, sig):
    proc, tree = _start(tmp_path)
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig, err
        assert not wait_gone(tree, 10), f"still running after {signal.Signals(sig).name}: {alive(tree)}"
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines[-1] == (f"ampkit compare: stopped by {signal.Signals(sig).name} during run 1 of 2 (0 runs "
                             "finished, the running one stopped): no verdict was written"), err
        assert "Traceback" not in err
        assert not (tmp_path / "cmp" / "compare.json").exists()  # a stopped comparison is never judged
    finally:
        proc.kill()
        kill_all(tree)


def test_the_script_dies_with_a_killed_ampkit(tmp_path):
    """SIGKILL runs no code in ampkit: the kernel's parent-death signal ends its child."""
    proc, tree = _start(tmp_path)
    child = [p for p in tree if p in {d.pid for d in descendants(proc.pid)}][0]
    try:
        proc.kill()
        proc.communicate(timeout=30)
        assert not wait_gone([child], 10), "the script's process outlived a SIGKILLed ampkit"
    finally:
        kill_all(tree)


@pytest.mark.slow  # one more script start on the busy 2-core machine: about 20 s
def test_a_stopped_audit_stops_the_script(tmp_path):
    pidfile = tmp_path / "helper.pid"
    proc = start_cli("audit", SCRIPT, str(pidfile), cwd=tmp_path)
    helper = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 120, "the script to start")
    tree = [p.pid for p in descendants(proc.pid)] + [int(helper)]
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert not wait_gone(tree, 10), f"still running: {alive(tree)}"
        assert err.strip().splitlines()[-1] == ("ampkit audit: stopped by SIGTERM (the script's run stopped, with all "
                                                "it started; nothing was audited)"), err
    finally:
        proc.kill()
        kill_all(tree)
