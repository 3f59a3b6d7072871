"""`ampkit train --nproc 2` SIGKILLed (no code runs in it, so it forwards nothing): its ranks die with it.

SIGTERM/SIGINT/SIGHUP are forwarded by torchrun's agent (tests/distributed/test_preemption_cpu.py); a SIGKILL
is not, and only the ranks' own tie to their parent (the kernel's parent-death signal) ends them.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from _runs import TASK_ARGS  # noqa: E402
from proctree import alive, descendants, kill_all, start_cli, wait_gone, wait_until  # noqa: E402


@pytest.mark.slow  # torchrun and two ranks starting on the busy 2-core machine: about 30 s
def test_the_ranks_die_with_a_killed_launcher(tmp_path):
    out = tmp_path / "run"
    proc = start_cli("train", *TASK_ARGS, "--nproc", "2", "--precision", "fp32", "--steps", "100000",
                     "--log-every", "1", "--out", str(out), cwd=tmp_path, group=True)
    ranks: list[int] = []
    try:
        wait_until(lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size > 0, 180,
                   "the ranks to train")
        ranks = [p.pid for p in descendants(proc.pid) if "ampkit" in " ".join(p.cmdline())]
        assert len(ranks) >= 2, descendants(proc.pid)
        proc.kill()
        proc.communicate(timeout=30)
        assert not wait_gone(ranks, 10), f"ranks outlived a SIGKILLed launcher: {alive(ranks)}"
    finally:
        proc.kill()
        kill_all(ranks)
