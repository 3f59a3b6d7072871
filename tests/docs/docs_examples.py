"""Find the ```python blocks of the docs and run them (used by test_docs_examples.py).

A block runs unless the line before its fence is a marker:

* ``<!-- skip-example: REASON -->``: not run (GPU-only or MUSA-only code, a fragment); REASON is required.
* ``<!-- example-file: NAME.py -->``: written to NAME.py in the page's folder instead of run, so a
  later block of the page can import it.

The blocks of one page run in order in one namespace, in a temporary folder, on the CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*(skip-example|example-file)\s*:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    code: str
    skip: str | None = None       # the reason, when skipped
    file: str | None = None       # the file name, when written instead of run


class MarkerError(ValueError):
    pass


def pages() -> list[Path]:
    """Every Markdown page of the site, and the README."""
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """The ```python blocks of one Markdown file, with their markers."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang != "python":
            continue
        skip = file = None
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = _MARKER.match(lines[prev].strip()) if prev >= 0 else None
        if marker:
            kind, value = marker.groups()
            if not value:
                raise MarkerError(f"{path}:{prev + 1}: `{kind}:` needs a value (a reason, or a file name)")
            if kind == "skip-example":
                skip = value
            else:
                file = value
        out.append(Block(path, start + 1, "\n".join(body) + "\n", skip, file))
    return out


def run_page(path: Path, folder: Path, text: str | None = None) -> int:
    """Run the blocks of one page in ``folder`` (which must be the current folder and on sys.path).
    Returns how many blocks ran; an exception names the page and line of the failing block."""
    namespace: dict = {"__name__": "__docs_example__"}
    ran = 0
    for block in blocks(path, text):
        if block.skip is not None:
            continue
        if block.file is not None:
            (folder / block.file).write_text(block.code, encoding="utf-8")
            continue
        try:
            exec(compile(block.code, f"{path.name}:{block.line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"the example at {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
                                 f":{block.line} failed: {type(exc).__name__}: {exc}") from exc
        ran += 1
    return ran
