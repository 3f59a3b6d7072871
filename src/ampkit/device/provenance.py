"""Where a result came from: the git commit of the ampkit source that produced it.

Benchmarks and comparisons record it, so a figure can be traced to the code that made it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["git_commit"]


def git_commit() -> str | None:
    """The commit of the checkout ampkit runs from (``"<sha>-dirty"`` with uncommitted changes), or None when
    ampkit is not installed from a git checkout (a wheel) or git is missing. ``$AMPKIT_GIT_COMMIT`` wins: a copy
    of the source on another machine (a lent GPU) carries a stale or no ``.git``, and the caller knows better."""
    if os.environ.get("AMPKIT_GIT_COMMIT"):
        return os.environ["AMPKIT_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    if not (root / "src" / "ampkit" / "provenance.py").is_file():
        return None  # installed from a wheel: a repository around site-packages is not ours

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{sha}-dirty" if dirty else sha
