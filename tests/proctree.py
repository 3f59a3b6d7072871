"""Real processes for the stop tests: start the real CLI, wait for what it starts, check nothing survives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

SRC = str(Path(__file__).resolve().parents[1] / "src")


def start_cli(*argv: str, cwd, group: bool = False) -> subprocess.Popen:
    """``python -m ampkit ARGV`` in a subprocess, stderr piped, using this checkout's code; ``group``: in a
    process group of its own, as a shell runs a command (a terminal's Ctrl-C goes to the whole group)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, "-m", "ampkit", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, start_new_session=group)


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(pids) -> list[int]:
    """The pids among ``pids`` that still run (zombies waiting to be reaped do not run)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for every pid to end; returns those still running."""
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    return left


def kill_all(pids) -> None:
    """Clean up after a failed test: leave nothing running on the machine."""
    for pid in alive(pids):
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
