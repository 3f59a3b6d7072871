"""Example outputs in the docs, printed by the product itself: ``python docs/gen_outputs.py [ID ...]``.

A page shows what a command prints between two markers; the command is the block's first line::

    <!-- output: compare-digits slow screenshot=runs/compare/report.html -->
    ```console
    $ ampkit compare
    (what it printed, written by this script)
    ```
    <!-- /output -->

Options after the ID: ``slow`` (its check takes more than ~20 s: tests/docs/test_outputs.py marks it
slow), ``file=SRC:NAME`` (copy SRC, relative to the repository, to NAME in the run's folder first),
``exit`` (append ``$ echo $?`` and the exit code), ``screenshot=HTML`` (after the run, render HTML, relative
to the run's folder, in chromium into docs/report-screenshot.png).

Every command runs for real, on the CPU (``AMPKIT_DEVICE=cpu``), in a fresh temporary folder, at a terminal
width of 80 columns. Per-run progress lines (``run 2/6 seed 0 bf16: ...``) are shown as one ``...``.
``normalize`` is what the test compares: numbers, times, the CPU's name and the speed-up's noise wording
masked, tables read column by column, so timing noise and re-wrapping pass while a changed row, word or
column fails. ``--check`` compares instead of writing (exit 1 on a difference).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
SCREENSHOT = ROOT / "docs" / "report-screenshot.png"
CHROMIUM = "/usr/bin/chromium"

_OPEN = re.compile(r"^<!--\s*output:\s*(\S+)(.*?)-->\s*$")
_CLOSE = re.compile(r"^<!--\s*/output\s*-->\s*$")
_PROGRESS = re.compile(r"^run \d+/\d+ ")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_TABLE = re.compile(r"^\s*[┏┃┡│└┗╭╰├┣]")
_RULE = re.compile(r"^\s*[┏┡└┗╭╰├┣]")
# Wording that depends on timing, not on the product: whether the speed-up's spread covers 1.0 (in a table
# cell, whose words are joined without spaces) and the notes on it (src/ampkit/verify/compare.py).
_VOLATILE_CELL = re.compile(r":withinnoise")
_VOLATILE_TEXT = re.compile(r"note: speed-up \S+ \([^)]*\): the seeds do not agree on faster or slower on this machine"
                            r"|note: \S+ was slower than FP32 here: samples/s \S+ \([^)]*\)|: within noise")


@dataclass
class Block:
    page: Path
    id: str
    command: str
    output: str                     # what the page shows now (after the command line)
    start: int                      # line index of the opening marker
    end: int                        # line index of the closing marker
    slow: bool = False
    exit: bool = False
    files: list[tuple[str, str]] = field(default_factory=list)
    screenshot: str | None = None


def pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The marked output blocks of one page."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        while i < len(lines) and not _CLOSE.match(lines[i]):
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: `<!-- output: {m.group(1)} -->` has no `<!-- /output -->`")
        body = lines[start + 1:i]
        if len(body) < 3 or not body[0].startswith("```") or not body[1].startswith("$ ") or body[-1] != "```":
            raise ValueError(f"{page}:{start + 1}: an output block is a fenced block whose first line is `$ COMMAND`")
        block = Block(page, m.group(1), body[1][2:].split("  #")[0].strip(), "\n".join(body[2:-1]), start, i)
        for opt in m.group(2).split():
            if opt == "slow":
                block.slow = True
            elif opt == "exit":
                block.exit = True
            elif opt.startswith("file="):
                src, _, name = opt[5:].partition(":")
                block.files.append((src, name or Path(src).name))
            elif opt.startswith("screenshot="):
                block.screenshot = opt[len("screenshot="):]
            else:
                raise ValueError(f"{page}:{start + 1}: unknown option {opt!r} of output block {block.id}")
        out.append(block)
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


def run(block: Block, folder: Path) -> str:
    """Run the block's command in ``folder`` on the CPU; its output as the page shows it."""
    for src, name in block.files:
        shutil.copyfile(ROOT / src, folder / name)
    argv = shlex.split(block.command)
    if argv[0] == "ampkit":
        argv = [sys.executable, "-m", "ampkit", *argv[1:]]
    env = dict(os.environ, AMPKIT_DEVICE="cpu", COLUMNS=str(WIDTH), PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    env.pop("NO_COLOR", None)
    proc = subprocess.run(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800, check=False)
    lines: list[str] = []
    for line in proc.stdout.replace(str(folder.resolve()) + os.sep, "").replace(str(folder) + os.sep, "").splitlines():
        line = line.rstrip()
        if _PROGRESS.match(line):
            if not lines or lines[-1] != "...":
                lines.append("...")
            continue
        lines.append(line)
    if block.exit:
        lines += ["$ echo $?", str(proc.returncode)]
    return "\n".join(lines)


def cpu_name() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from ampkit.device import detect_device

    return detect_device("cpu").name


def normalize(text: str, cpu: str | None = None) -> list[str]:
    """What must not drift: the words of the text and, for a table, each column's text top to bottom, with
    numbers, the CPU's name and timing wording masked (so re-wrapping and timing noise pass)."""
    if cpu:
        text = text.replace(cpu, "<cpu>")
    out: list[str] = []
    columns: list[str] | None = None
    prose: list[str] = []
    for line in text.splitlines() + [""]:
        if _TABLE.match(line):
            if prose:
                out += _NUMBER.sub("#", _VOLATILE_TEXT.sub("", " ".join(prose))).split()
                prose = []
            columns = [] if columns is None else columns
            if _RULE.match(line):
                continue
            cells = re.split(r"[│┃]", line)[1:-1]
            columns += [""] * (len(cells) - len(columns))
            for k, cell in enumerate(cells):
                columns[k] += "".join(_NUMBER.sub("#", cell).split())
            continue
        if columns is not None:
            out.append(f"table of {len(columns)} columns")
            out += [f"  column {k + 1}: " + _VOLATILE_CELL.sub("", re.sub("#+", "#", col))
                    for k, col in enumerate(columns)]
            columns = None
        prose.append(line)
    out += _NUMBER.sub("#", _VOLATILE_TEXT.sub("", " ".join(prose))).split()
    return out


def render(text: str, block: Block, output: str) -> str:
    lines = text.splitlines()
    fence = lines[block.start + 1]
    shown = lines[block.start + 2]
    new = lines[:block.start + 1] + [fence, shown] + output.splitlines() + ["```"] + lines[block.end:]
    return "\n".join(new) + ("\n" if text.endswith("\n") else "")


def screenshot(html: Path, png: Path) -> None:
    """The report as a person sees it: chromium at 1280 px wide, as tall as the page says it is."""
    def chromium(*args: str) -> str:
        profile = tempfile.mkdtemp(prefix="ampkit-chromium-")
        try:
            return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                   "--disable-background-networking", "--disable-component-update",
                                   f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
                                  capture_output=True, text=True, timeout=180, check=False).stdout
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    dom = chromium("--dump-dom", "--window-size=1280,2400", html.resolve().as_uri())
    height = re.search(r'data-height="(\d+)"', dom)
    height = min(max(int(height.group(1)) if height else 2400, 600), 6000)
    chromium(f"--screenshot={png}", "--hide-scrollbars", f"--window-size=1280,{height}", html.resolve().as_uri())


def main(argv: list[str]) -> int:
    check = "--check" in argv
    ids = [a for a in argv if not a.startswith("--")]
    cpu = cpu_name()
    failed = 0
    for page in pages():
        for block in reversed(blocks(page)):     # from the end, so earlier blocks' line numbers stay right
            if ids and block.id not in ids:
                continue
            with tempfile.TemporaryDirectory(prefix="ampkit-docs-") as tmp:
                output = run(block, Path(tmp))
                if block.screenshot and not check:
                    screenshot(Path(tmp) / block.screenshot, SCREENSHOT)
            where = f"{page.relative_to(ROOT)} [{block.id}]"
            if check:
                if normalize(output, cpu) != normalize(block.output, cpu):
                    print(f"{where}: differs from what `{block.command}` prints now", file=sys.stderr)
                    failed += 1
                continue
            page.write_text(render(page.read_text(encoding="utf-8"), block, output), encoding="utf-8")
            print(f"{where}: written", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
