"""Time the main job, `ampkit compare` (digits, defaults), on this machine's CPU: CPU time and wall time.

    python benchmarks/cpu_compare_timing.py            # measure, write benchmarks/cpu-compare-timing.json
    python benchmarks/cpu_compare_timing.py --pages    # and rewrite the sentence on every page that states it

The JSON is the one place the figure lives. README.md and the docs pages carry it between
``<!-- compare-timing -->`` and ``<!-- /compare-timing -->``, as :func:`sentence` writes it, and
tests/docs/test_compare_timing.py fails when a page states anything else. CPU time (user + system of the
`ampkit compare` process, from ``getrusage``) is the figure to read on a shared machine: the wall time
depends on how many others use the cores; the load average at the start and the end says how busy it was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "cpu-compare-timing.json"
PAGES = ("README.md", "docs/getting-started.md", "docs/commands/compare.md")
MARK = re.compile(r"<!-- compare-timing -->(.*?)<!-- /compare-timing -->", re.S)


def sentence(data: dict) -> str:
    """The words every page uses for the figure."""
    m = data["machine"]
    wall = data["wall_s"]
    wall_text = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} minutes"
    load = max(m["load_start"], m["load_end"])
    busy = (f"a quiet {m['cores']}-core CPU (load average {load:.1f})" if load < 1 else
            f"a {m['cores']}-core CPU shared with other work (load average {m['load_start']:.0f}-{m['load_end']:.0f})")
    return f"{data['cpu_s']:.0f} s of CPU time and {wall_text} of wall time on {busy}, measured {data['date']}"


def measure() -> dict:
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ampkit", "compare", "--out", out], capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        verdict = json.loads((Path(out) / "compare.json").read_text())["verdict"] if proc.returncode < 2 else None
    return {"command": "ampkit compare", "exit_code": proc.returncode, "verdict": verdict,
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "wall_s": round(wall, 1), "max_rss_mib": round(after.ru_maxrss / 1024),
            "machine": {"cores": os.cpu_count(), "load_start": round(load_start, 1),
                        "load_end": round(os.getloadavg()[0], 1)},
            "date": datetime.date.today().isoformat(), "measured_with": "resource.getrusage(RUSAGE_CHILDREN)"}


def write_pages(data: dict) -> None:
    text = sentence(data)
    for page in PAGES:
        path = ROOT / page
        body = path.read_text(encoding="utf-8")
        path.write_text(MARK.sub(f"<!-- compare-timing -->{text}<!-- /compare-timing -->", body), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", action="store_true", help="rewrite the pages from the JSON")
    ap.add_argument("--no-measure", action="store_true", help="only rewrite the pages from the existing JSON")
    args = ap.parse_args()
    if not args.no_measure:
        RESULT.write_text(json.dumps(measure(), indent=2) + "\n", encoding="utf-8")
    if args.pages or args.no_measure:
        write_pages(json.loads(RESULT.read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()
