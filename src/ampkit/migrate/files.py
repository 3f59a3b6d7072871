"""Files and folders: which ``.py`` files to migrate, the diff, and the atomic write."""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import stat
import tempfile
import time
import tokenize
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path

from ampkit.children import GRACE_S, init_worker
from ampkit.errors import AmpkitError, first_line
from ampkit.migrate.engine import check_options, may_match, migrate_source, musa_version_of
from ampkit.migrate.findings import Finding

__all__ = ["FileResult", "migrate_paths", "iter_python_files", "atomic_write", "default_jobs"]

# Folders nobody wants rewritten: VCS data, virtual environments, caches.
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist"}


@dataclass(frozen=True)
class FileResult:
    """What happened to one file. ``error`` is a one-line reason; the file was then not touched."""

    path: str
    original: str = ""
    new_code: str = ""
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    changed: bool = False
    written: bool = False
    error: str | None = None
    #: False when the file was not parsed because it mentions nothing any rule looks for.
    analysed: bool = True
    #: the encoding the file declares (PEP 263); it is written back in it.
    encoding: str = "utf-8"

    @property
    def diff(self) -> str:
        """Unified diff of the proposed change ("" when unchanged)."""
        if not self.changed:
            return ""
        old, new = _lines(self.original), _lines(self.new_code)
        for lines in (old, new):  # a file without a final newline still diffs line by line
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n\\ No newline at end of file\n"
        a, b = (self.path, self.path) if os.path.isabs(self.path) else (f"a/{self.path}", f"b/{self.path}")
        return "".join(difflib.unified_diff(old, new, a, b))


def _lines(text: str) -> list[str]:
    # Lines end at "\n" only, as in git and patch: a "\r" (of "\r\n", or a lone one) stays part
    # of its line, so every diff line ends in "\n" and the diff applies byte for byte.
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def iter_python_files(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[str, str | None]]:
    """``(path, error)`` for every file to migrate: files as given, folders searched for ``*.py``.

    Symlinks inside folders are not followed, so nothing outside the given paths is touched.
    """
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                                 and not os.path.islink(os.path.join(root, d)))
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if name.endswith(".py") and not os.path.islink(full) and _first(full, seen):
                        yield full, None
        elif path.is_file():
            if _first(str(path), seen):
                yield str(path), None
        else:
            yield str(path), "no such file or folder"


def _first(path: str, seen: set[str]) -> bool:
    """True the first time a file is met, however it was named (a file and its folder, a link)."""
    real = os.path.realpath(path)
    if real in seen:
        return False
    seen.add(real)
    return True


def atomic_write(path: str, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old file or the new one, never half:
    a temporary file in the same folder, fsync, then ``os.replace``; the file mode is kept."""
    target = os.path.realpath(path)  # write through a symlink the user named, not over it
    folder = os.path.dirname(target) or "."
    mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".ampkit-tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable; not every filesystem allows opening a folder
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class _Source:
    text: str  # without a BOM
    encoding: str  # the PEP 263 encoding the file declares (utf-8 when it declares none)
    bom: str


def _decode(data: bytes) -> _Source:
    """Bytes -> text with the encoding the file declares (PEP 263 cookie or BOM; utf-8 otherwise).

    Raises :class:`UnicodeError` or :class:`SyntaxError` (an unknown or contradictory cookie)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if not str(exc).startswith("invalid or missing encoding declaration"):
            raise  # an unknown or contradictory cookie
        encoding = "utf-8"  # no cookie and not UTF-8: the decode below names the byte
    bom = ""
    if encoding == "utf-8-sig":
        encoding, bom = "utf-8", "\ufeff"
    # Bytes in, bytes out: \r\n stays as written, so untouched lines stay byte-identical.
    text = data.decode(encoding)
    return _Source(text[len(bom):] if text.startswith("\ufeff") else text, encoding, bom)


def _load(path: str, target: str, select: frozenset[str] | None, precheck: bool) -> FileResult | _Source:
    """Read and decode one file; a :class:`FileResult` when that is all there is to it (an error,
    or ``precheck`` found none of the rules' words), else the source to analyse."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return FileResult(path, error=f"{path}: cannot read ({exc.strerror or first_line(exc)}); skipped")
    try:
        src = _decode(data)
    except SyntaxError as exc:  # an unknown or contradictory coding cookie
        return FileResult(path, error=f"{path}: cannot decode ({exc.msg}); skipped")
    except UnicodeDecodeError as exc:
        return FileResult(path, error=f"{path}: not valid {exc.encoding} (byte {exc.start}); skipped. If the "
                          "file uses another encoding, declare it on line 1: # -*- coding: NAME -*-")
    if precheck and not may_match(src.text, target=target, select=select):
        original = src.bom + src.text
        return FileResult(path, original, original, analysed=False, encoding=src.encoding)
    return src


def _analyse(path: str, src: _Source, target: str, select: frozenset[str] | None,
             musa_version: str | None = None) -> FileResult:
    """Migrate one decoded file. Every failure becomes a one-line ``error``: one hostile file (a
    parser limit, a recursion limit, memory, a rule bug) must not take down a run over a repository."""
    original = src.bom + src.text
    try:
        res = migrate_source(src.text, target=target, select=select, filename=path, musa_version=musa_version)
    except AmpkitError as exc:
        return FileResult(path, original=original, error=str(exc))
    except Exception as exc:  # noqa: BLE001 -- a bug on one file must not end the run over the rest
        return FileResult(path, original=original, error=f"{path}: internal error ({first_line(exc, 200)}); "
                          "skipped, left untouched. Please report this with the file.")
    new_code = src.bom + res.new_code
    if res.changed:
        try:
            new_code.encode(src.encoding)
        except UnicodeError:
            return FileResult(path, original=original, error=f"{path}: the rewrite cannot be written in the "
                              f"file's encoding ({src.encoding}); skipped, left untouched")
    return FileResult(path, original, new_code, res.findings, res.changed, encoding=src.encoding)


def default_jobs() -> int:
    """Worker processes to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _run_all(tasks: list[tuple[str, _Source]], target: str, select: frozenset[str] | None,
             jobs: int, musa_version: str | None = None) -> list[FileResult]:
    if jobs <= 1 or len(tasks) <= 1:
        return [_analyse(p, src, target, select, musa_version) for p, src in tasks]
    results: list[FileResult | None] = [None] * len(tasks)
    # Workers die with this process (even when it is SIGKILLed) and leave Ctrl-C to it.
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=init_worker)
    try:
        futures = [pool.submit(_analyse, p, src, target, select, musa_version) for p, src in tasks]
        for i, fut in enumerate(futures):
            results[i] = fut.result()
    except BrokenProcessPool:  # a worker died (a crash in native code); the finished files stand
        pass
    except BaseException:
        # A stop (Ctrl-C, a signal turned into an exception): end the workers now; the pool's own shutdown would
        # first finish every file already queued (minutes on a large tree).
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return [r if r is not None else FileResult(p, error=f"{p}: the analysing process died; skipped, left "
                                               "untouched (run with --jobs 1 to find the file)")
            for r, (p, _) in zip(results, tasks)]


def stop_pool(pool: ProcessPoolExecutor, grace_s: float = GRACE_S) -> None:
    """Cancel what ``pool`` has not started and end its worker processes: SIGTERM, SIGKILL after ``grace_s``."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    results = getattr(pool, "_result_queue", None)
    for w in workers:
        w.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
        if w.is_alive():
            w.kill()
            w.join(1.0)
    # A worker ended while it sent a result leaves half a message in the result pipe: the pool's manager thread
    # then waits in recv() for the rest, and the interpreter's exit, which joins that thread, waits with it (seen:
    # "stopped by SIGINT", then no exit). With every worker gone, this process holds the pipe's last write end;
    # closing it turns that wait into an end of file, which the pool handles as a broken pool and ends.
    writer = getattr(results, "_writer", None)
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()


def migrate_paths(paths: Iterable[str | os.PathLike], *, fix: bool = False, target: str = "agnostic",
                  select: Iterable[str] | None = None, jobs: int | None = None,
                  musa_version: str | None = None) -> list[FileResult]:
    """Migrate files and folders; one :class:`FileResult` per file, in the order found.

    Files found in folders are first checked for the words the rules look for (``torch``, ``amp``,
    ``autocast``, ``cuda``, ...); a file that mentions none of them is not parsed
    (``analysed=False``). Files named directly are always parsed. The rest is spread over ``jobs``
    worker processes (default: every CPU). A file that cannot be read, decoded, parsed or analysed
    gets a one-line ``error`` and is left untouched; the others are still processed. With
    ``fix=True`` changed files are written atomically, in the encoding they declare (PEP 263).
    ``musa_version`` (``--target musa``): the torch_musa release the code will run on; before 2.1
    files that now use "musa" get ``import torch_musa``.
    Raises :class:`~ampkit.errors.UsageError` for a bad ``target``, ``select`` or ``jobs``.
    """
    selected = check_options(target, select)
    musa_version_of(musa_version)  # a bad version is a usage error before any file is read
    if jobs is not None and jobs < 1:
        from ampkit.errors import UsageError

        raise UsageError(f"--jobs must be 1 or more, not {jobs}")
    paths = list(paths)
    named = {str(p) for p in paths if Path(p).is_file()}  # named files are parsed whatever they say
    results: list[FileResult] = []
    tasks: list[tuple[str, _Source]] = []
    slots: list[int] = []
    for path, error in iter_python_files(paths):
        loaded = FileResult(path, error=f"{path}: {error}") if error is not None else \
            _load(path, target, selected, precheck=path not in named)
        if isinstance(loaded, _Source):
            slots.append(len(results))
            tasks.append((path, loaded))
        results.append(loaded)
    for slot, res in zip(slots, _run_all(tasks, target, selected, jobs or default_jobs(), musa_version)):
        results[slot] = _write(res) if fix and res.changed and res.error is None else res
    return results


def _write(res: FileResult) -> FileResult:
    try:
        atomic_write(res.path, res.new_code, res.encoding)
    except OSError as exc:
        return replace(res, error=f"{res.path}: cannot write ({exc.strerror or first_line(exc)})")
    return replace(res, written=True)
