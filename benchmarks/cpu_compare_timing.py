"""Time the main job, `ampkit compare` (digits, defaults), on this machine's CPU: CPU time and wall time.

    python benchmarks/cpu_compare_timing.py            # measure, write benchmarks/cpu-compare-timing.json
    python benchmarks/cpu_compare_timing.py --pages    # and rewrite the sentence on every page that states it

The JSON is the one place the figure lives. README.md and the docs pages carry it between
``<!-- compare-timing -->`` and ``<!-- /compare-timing -->``, as :func:`sentence` writes it, and
tests/docs/test_compare_timing.py fails when a page states anything else. CPU time (user + system of the
`ampkit compare` process, from ``getrusage``) is the figure to read on a shared machine: the wall time
depends on how many others use the cores; the load average at the start and the end says how busy it was.
The JSON keeps one record per kind of machine, ``quiet`` (load average below 1 at the start and the end) and
``busy``, each with its load and the seeds ``--seeds auto`` used; a measurement replaces the record of its kind.
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


QUIET_LOAD = 1.0  # a 1-minute load average below this at the start and the end: a quiet machine


def _kind(rec: dict) -> str:
    m = rec["machine"]
    return "quiet" if max(m["load_start"], m["load_end"]) < QUIET_LOAD else "busy"


def _seeds_text(rec: dict) -> str:
    used = rec["seeds_used"]
    if rec["seeds_option"] == "auto":
        return f"the default --seeds auto ({used} seeds)"
    return f"{used} seeds"


def _one(rec: dict, *, first: bool) -> str:
    m = rec["machine"]
    wall = rec["wall_s"]
    wall_text = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} minutes"
    if _kind(rec) == "quiet":
        where = f"a quiet {m['cores']}-core CPU (load average {max(m['load_start'], m['load_end']):.1f})"
    else:
        where = (f"{'a' if first else 'the same'} {m['cores']}-core CPU shared with other work "
                 f"(load average {m['load_start']:.1f} at the start, {m['load_end']:.1f} at the end)")
    return (f"{rec['cpu_s']:.0f} s of CPU time and {wall_text} of wall time on {where}, with {_seeds_text(rec)}, "
            f"measured {rec['date']}")


def sentence(data: dict) -> str:
    """The words every page uses for the figures: the quiet machine's, then the busy machine's, each as recorded
    (its load average at the start and the end, the seeds it used)."""
    parts = [_one(data[k], first=i == 0) for i, k in enumerate(k for k in ("quiet", "busy") if k in data)]
    return "; ".join(parts[:1] + [f"on a busy machine {p}" if " shared with other work" in p else p
                                  for p in parts[1:]])


def measure() -> dict:
    """One run of the default `ampkit compare` (digits, --seeds auto) in a fresh process."""
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ampkit", "compare", "--out", out], capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_end = os.getloadavg()
        result = json.loads((Path(out) / "compare.json").read_text()) if proc.returncode in (0, 1, 3) else {}
    return {"command": "ampkit compare", "exit_code": proc.returncode, "verdict": result.get("verdict"),
            "seeds_option": "auto", "seeds_used": len(result.get("seeds", [])),
            "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "wall_s": round(wall, 1), "max_rss_mib": round(after.ru_maxrss / 1024),
            "machine": {"cores": os.cpu_count(), "load_start": round(load_start[0], 1),
                        "load_end": round(load_end[0], 1), "loadavg_1_5_15_start": [round(x, 2) for x in load_start],
                        "loadavg_1_5_15_end": [round(x, 2) for x in load_end]},
            "date": datetime.date.today().isoformat(), "git_commit": _commit(),
            "measured_with": "resource.getrusage(RUSAGE_CHILDREN)"}


def _commit() -> str | None:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def record(data: dict, rec: dict) -> dict:
    """``data`` with ``rec`` as its quiet or busy record (by the load it measured); the other one is kept."""
    return {**data, _kind(rec): rec}


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
        old = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.exists() else {}
        RESULT.write_text(json.dumps(record(old, measure()), indent=2) + "\n", encoding="utf-8")
    if args.pages or args.no_measure:
        write_pages(json.loads(RESULT.read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()
