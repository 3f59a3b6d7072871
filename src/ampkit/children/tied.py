"""The processes ampkit starts live no longer than ampkit: a stopped or killed ampkit leaves nothing behind.

Every child (a ``compare SCRIPT`` run, ``migrate``'s workers) is tied to this process two ways:

* it runs in its own process group (a new session), and :func:`run_tied` stops that whole group (the script
  and whatever the script started, e.g. data-loader workers) when anything ends the wait early: a stop
  signal turned into an exception (:class:`~ampkit.verify.interrupt.Interrupted`, ``KeyboardInterrupt``),
  a timeout, an error. SIGTERM first, SIGKILL after ``grace_s``;
* on Linux it asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so that even a
  SIGKILLed ampkit, which runs no code, leaves no child training on. Elsewhere a thread in the child watches
  the parent's pid instead (:func:`tie_to_parent`).

Nothing here prints.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

__all__ = ["GRACE_S", "tie_to_parent", "init_worker", "start_tied", "stop_group", "run_tied"]

GRACE_S = 3.0  # between SIGTERM to a child's group and SIGKILL
_PR_SET_PDEATHSIG = 1


def tie_to_parent(parent: int | None = None) -> None:
    """Called in a child: die when ``parent`` (default: the current parent) dies.

    Linux: the kernel sends SIGKILL at the parent's death (``PR_SET_PDEATHSIG``); if the parent is already
    gone (it died before this ran) the child exits at once. Elsewhere: a daemon thread polls the parent's pid.
    """
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died between fork and prctl
                    os._exit(128 + int(signal.SIGKILL))
                return
        except (OSError, AttributeError):
            pass  # no usable libc: fall back to watching

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(128 + int(signal.SIGTERM))

    threading.Thread(target=watch, name="ampkit-parent-watch", daemon=True).start()


def init_worker() -> None:
    """A pool worker's initializer (``ProcessPoolExecutor(initializer=init_worker)``): tied to its parent, and
    deaf to the terminal's Ctrl-C (the parent stops its workers itself) while SIGTERM ends it quietly; a fork
    would otherwise inherit the parent's Python handlers and print a traceback per worker."""
    tie_to_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _preexec(parent: int):
    def tie() -> None:  # runs in the child between fork and exec; the prctl setting survives exec
        if sys.platform.startswith("linux"):
            tie_to_parent(parent)
    return tie


def start_tied(cmd: Sequence[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen)`` in a new process group, killed by the kernel if this process dies
    (Linux; a child that is Python can call :func:`tie_to_parent` itself elsewhere)."""
    return subprocess.Popen(list(cmd), start_new_session=True, preexec_fn=_preexec(os.getpid()), **popen)


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Stop ``proc`` and everything in its process group: SIGTERM, then SIGKILL after ``grace_s`` seconds
    (``proc`` is reaped; the group's other members are orphans of init, which reaps them)."""
    if proc.poll() is not None:
        _signal_group(proc.pid, signal.SIGKILL)  # leftovers of a child that is gone
        return
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    finally:  # also when a second Ctrl-C cuts the grace period short
        _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_tied(cmd: Sequence[str], *, timeout_s: float | None = None, grace_s: float = GRACE_S,
             **popen: Any) -> subprocess.Popen:
    """Run ``cmd`` to its end in a tied child (:func:`start_tied`) and return the finished ``Popen``
    (``returncode`` set). Whatever ends the wait early (a timeout: :class:`subprocess.TimeoutExpired`; a stop
    signal's exception; ``KeyboardInterrupt``) first stops the child's whole group, then propagates."""
    proc = start_tied(cmd, **popen)
    try:
        proc.wait(timeout=timeout_s)
    except BaseException:
        stop_group(proc, grace_s)
        raise
    _signal_group(proc.pid, signal.SIGKILL)  # what the script left running in its group ends with it
    return proc
