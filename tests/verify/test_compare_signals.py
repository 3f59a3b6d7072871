"""A stop signal ends the whole `ampkit compare`, with 128 + N, and nothing cut short is judged or written.

Real processes, real signals: `ampkit compare` runs as a subprocess with its stderr piped (so it prints a line
per logged step), and the signal is sent once a run is under way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from task_specs import OVERFLOW_NORM, TOY

pytestmark = pytest.mark.slow  # 3 real comparisons in subprocesses: about 70 s each on the busy 2-core machine


def _start(tmp_path, *extra: str) -> subprocess.Popen:
    out = tmp_path / "cmp"
    argv = [sys.executable, "-m", "ampkit", "compare", "--seeds", "2", "--no-audit", "--out", str(out), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(proc: subprocess.Popen, needle: str, timeout: float = 240.0) -> list[str]:
    """stderr lines up to the first that contains ``needle``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    proc.kill()
    raise AssertionError(f"never saw {needle!r}; stderr so far:\n{''.join(seen)}")


def _stop(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("compare went on running after the signal") from None
    return proc.returncode, out, err


@pytest.mark.parametrize("sig, needle", [
    (signal.SIGTERM, "run 1/4 seed 0 fp32: step 3/"),   # the first run, mid-way
    (signal.SIGINT, "run 2/4 seed 0 bf16: step 3/"),    # the AMP run, after a finished FP32 run
])
def test_signal_during_a_run_ends_compare_unjudged(tmp_path, sig, needle):
    proc = _start(tmp_path, "--task", TOY, "--precision", "bf16", "--steps", "300", "--log-every", "1")
    _wait_for(proc, needle)
    code, out, err = _stop(proc, sig)
    assert code == 128 + sig, (code, err[-2000:])
    assert f"stopped by {signal.Signals(sig).name}" in err and "no verdict was written" in err
    assert "Traceback" not in err
    assert "PASS" not in out and "FAIL" not in out  # nothing judged
    assert not (tmp_path / "cmp" / "compare.json").exists() and not (tmp_path / "cmp" / "report.html").exists()
    assert "run 3/4" not in err  # no further run started


def test_signal_during_explain_ends_compare_unjudged(tmp_path):
    """--explain after a FAIL: a SIGTERM while it reruns or ranks ends everything, no verdict or report."""
    proc = _start(tmp_path, "--task", OVERFLOW_NORM, "--precision", "fp16", "--steps", "20", "--explain")
    _wait_for(proc, "explain: ")
    code, out, err = _stop(proc, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, (code, err[-2000:])
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert "PASS" not in out and "FAIL" not in out
    assert not (tmp_path / "cmp" / "compare.json").exists()
