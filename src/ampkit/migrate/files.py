"""Files and folders: which ``.py`` files to migrate, the diff, and the atomic write."""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ampkit.errors import AmpkitError
from ampkit.migrate.engine import check_options, migrate_source
from ampkit.migrate.findings import Finding

__all__ = ["FileResult", "migrate_paths", "iter_python_files", "atomic_write"]

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

    @property
    def diff(self) -> str:
        """Unified diff of the proposed change ("" when unchanged)."""
        if not self.changed:
            return ""
        old, new = self.original.splitlines(keepends=True), self.new_code.splitlines(keepends=True)
        for lines in (old, new):  # a file without a final newline still diffs line by line
            if lines and not lines[-1].endswith(("\n", "\r")):
                lines[-1] += "\n\\ No newline at end of file\n"
        a, b = (self.path, self.path) if os.path.isabs(self.path) else (f"a/{self.path}", f"b/{self.path}")
        return "".join(difflib.unified_diff(old, new, a, b))


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


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old file or the new one, never half:
    a temporary file in the same folder, fsync, then ``os.replace``; the file mode is kept."""
    target = os.path.realpath(path)  # write through a symlink the user named, not over it
    folder = os.path.dirname(target) or "."
    mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".ampkit-tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
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


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    # Bytes in, bytes out: \r\n and a BOM stay as written, so untouched lines stay byte-identical.
    return data.decode("utf-8")


_BOM = "\ufeff"


def migrate_paths(paths: Iterable[str | os.PathLike], *, fix: bool = False, target: str = "agnostic",
                  select: Iterable[str] | None = None) -> list[FileResult]:
    """Migrate files and folders. With ``fix=True`` changed files are written (atomically);
    files with errors are never written. Raises :class:`~ampkit.errors.UsageError` for a bad
    ``target`` or ``select``."""
    select = check_options(target, select)
    results: list[FileResult] = []
    for path, error in iter_python_files(paths):
        if error is not None:
            results.append(FileResult(path, error=f"{path}: {error}"))
            continue
        try:
            original = _read(path)
        except (OSError, UnicodeDecodeError) as exc:
            results.append(FileResult(path, error=f"{path}: cannot read as UTF-8 ({exc.__class__.__name__})"))
            continue
        bom = _BOM if original.startswith(_BOM) else ""
        try:
            res = migrate_source(original[len(bom):], target=target, select=select, filename=path)
        except AmpkitError as exc:
            results.append(FileResult(path, original=original, error=str(exc)))
            continue
        written = False
        if fix and res.changed:
            try:
                atomic_write(path, bom + res.new_code)
                written = True
            except OSError as exc:
                results.append(FileResult(path, original, res.new_code, res.findings, res.changed,
                                          error=f"{path}: cannot write ({exc.strerror or exc})"))
                continue
        results.append(FileResult(path, original, bom + res.new_code, res.findings, res.changed, written))
    return results
