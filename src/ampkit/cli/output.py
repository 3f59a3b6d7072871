"""Outputs that cannot be written (a full disk, ``> /dev/full``, a read-only folder): one line, not a traceback.

:func:`guarded_stdout` wraps ``sys.stdout`` for the length of a command so that a failed write or flush raises
:class:`OutputError` ("cannot write to standard output: No space left on device"); ``main()`` prints it as one
line and exits 1. :func:`keep_elsewhere` saves a result whose own destination failed in a temporary file, so
that what was measured is not lost, and says where. :func:`os_error_line` is the one line for any other
``OSError`` a command lets out (a file it writes, a folder it creates).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from typing import Any, Iterator

from ampkit.errors import AmpkitError

__all__ = ["OutputError", "guarded_stdout", "keep_elsewhere", "write_json_file", "os_error_line", "silence_stdout"]


class OutputError(AmpkitError):
    """An output could not be written; the message says which, why, and where the result went if it was kept."""

    exit_code = 1


class _Guarded:
    """``sys.stdout`` whose write and flush turn an ``OSError`` (other than a closed pipe) into OutputError."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _call(self, name: str, *args):
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise  # `ampkit ... | head`: main() stops quietly
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None

    def write(self, text: str) -> int:
        return self._call("write", text)

    def writelines(self, lines) -> None:
        self._call("writelines", lines)

    def flush(self) -> None:
        self._call("flush")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Inside, ``sys.stdout`` raises :class:`OutputError` for a write that fails; everything written is flushed
    before leaving, so that the failure of a buffered write is seen here and not at interpreter exit."""
    original = sys.stdout
    if original is None:
        yield
        return
    sys.stdout = _Guarded(original)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = original


def silence_stdout() -> None:
    """After a failed write to stdout: point it at /dev/null, so that the interpreter's last flush at exit does
    not fail again (a second message and exit code 120)."""
    try:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives until exit
        os.dup2(sys.stdout.fileno(), 1)
    except OSError:
        pass


def keep_elsewhere(obj: Any, what: str) -> str | None:
    """Save ``obj`` as JSON in a new temporary file named after ``what``; its path, or None if that fails too."""
    try:
        fd, path = tempfile.mkstemp(prefix=f"ampkit-{what}-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
        return path
    except OSError:
        return None


def write_json_file(path: str, obj: Any, flag: str, what: str = "result") -> None:
    """Write ``obj`` as JSON to ``path`` (``flag`` names the option, ``--out``); when that fails (a full disk),
    an :class:`OutputError` that gives the reason and where the JSON was kept instead."""
    text = json.dumps(obj, indent=2, default=str) + "\n"
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        kept = keep_elsewhere(obj, what)
        raise OutputError(f"cannot write {flag} {path}: {exc.strerror or exc}; " +
                          (f"the JSON is saved in {kept}" if kept else "the JSON could not be saved elsewhere either")) from None


def os_error_line(exc: OSError) -> str:
    """``"cannot write runs/x/metrics.jsonl: No space left on device"``-like: the file and the system's reason."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    name = exc.filename if exc.filename is not None else None
    if name is None:
        return f"{reason} (the file system refused an output: check the free space and permissions)"
    verb = "cannot write" if _is_write_error(exc) else "cannot use"
    return f"{verb} {name}: {reason}"


def _is_write_error(exc: OSError) -> bool:
    import errno

    return exc.errno in {errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM,
                         getattr(errno, "EDQUOT", -1)}
