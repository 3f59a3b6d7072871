"""Ctrl-C that works while one long torch op runs: exit 128 + N within a few seconds.

Python runs a signal handler only between bytecodes, and one forward of a large model on the CPU is a single
call into torch that can last a minute: ``KeyboardInterrupt`` then comes only after it. Inside
:func:`exit_promptly` a watcher thread hears the signal at once (``signal.set_wakeup_fd``; torch releases the
GIL while it computes) and, when the main thread has not stopped ``grace_s`` seconds later, prints one line
and ends the process with 128 + N. For commands that have nothing to save mid-way (``bench``); ``train`` stops
after the step instead, to write its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Iterator

__all__ = ["exit_promptly", "GRACE_S"]

GRACE_S = 3.0


@contextlib.contextmanager
def exit_promptly(command: str, grace_s: float = GRACE_S,
                  signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                data = reader.recv(1)
            except OSError:
                return
            if not data or done.is_set():
                return
            signum = data[0]
            if signum not in signals or done.wait(grace_s):
                continue
            name = signal.Signals(signum).name
            os.write(2, f"ampkit {command}: stopped by {name} (the torch call in flight did not return within "
                        f"{grace_s:g} s; nothing was written)\n".encode())
            os._exit(128 + signum)

    thread = threading.Thread(target=watch, name="ampkit-hardstop", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        writer.close()  # wakes the watcher (recv returns b"")
        thread.join(timeout=1.0)
        reader.close()
