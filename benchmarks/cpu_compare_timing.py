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
THREADS_PAGE = "docs/getting-started.md"  # where the one-thread figure is stated
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
        load = f"load average {max(m['load_start'], m['load_end']):.1f}"
    else:
        load = f"load average {m['load_start']:.1f} at the start, {m['load_end']:.1f} at the end"
    if first:
        where = f"a {_kind(rec)} {m['cores']}-core CPU ({load})"
        return (f"{rec['cpu_s']:.0f} s of CPU time and {wall_text} of wall time on {where} with {_seeds_text(rec)}, "
                f"measured {rec['date']}")
    return (f"{rec['cpu_s']:.0f} s and {wall_text} on the same CPU when {_kind(rec)} ({load}) with "
            f"{_seeds_text(rec)}, measured {rec['date']}")


def sentence(data: dict) -> str:
    """The words every page uses for the figures: the quiet machine's, then the busy machine's, each as recorded
    (its load average at the start and the end, the seeds it used)."""
    return "; ".join(_one(data[k], first=i == 0) for i, k in enumerate(k for k in ("quiet", "busy") if k in data))


def measure(threads: int | None = None) -> dict:
    """One run of the default `ampkit compare` (digits, --seeds auto) in a fresh process; ``threads``: with
    ``OMP_NUM_THREADS`` set to it (torch's intra-op threads), else the environment's."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ampkit", "compare", "--out", out], capture_output=True,
                              text=True, env=env, check=False)
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
            "omp_num_threads": env.get("OMP_NUM_THREADS"), "date": datetime.date.today().isoformat(),
            "git_commit": _commit(),
            "measured_with": "resource.getrusage(RUSAGE_CHILDREN)"}


def _commit() -> str | None:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def record(data: dict, rec: dict) -> dict:
    """``data`` with ``rec`` as its quiet or busy record (by the load it measured); the other one is kept."""
    return {**data, _kind(rec): rec}


def write_pages(data: dict) -> None:
    text = sentence(data)
    threads = threads_sentence(json.loads(THREADS_RESULT.read_text(encoding="utf-8")))
    for page in PAGES:
        path = ROOT / page
        body = MARK.sub(f"<!-- compare-timing -->{text}<!-- /compare-timing -->", path.read_text(encoding="utf-8"))
        body = THREADS_MARK.sub(f"<!-- compare-threads -->{threads}<!-- /compare-threads -->", body)
        path.write_text(body, encoding="utf-8")


THREADS_RESULT = ROOT / "benchmarks" / "cpu-compare-threads.json"


def threads_comparison(rounds: int) -> dict:
    """Interleaved runs of ampkit's default (the digits task's one thread on the CPU, ``Task.cpu_threads``) and of
    torch's default thread count (OMP_NUM_THREADS set to it, which ampkit leaves alone), so that both see the
    same load: on a shared CPU, threads waiting on busy cores cost CPU time."""
    import torch

    runs = []
    for _ in range(rounds):
        for threads in (torch.get_num_threads(), None):
            runs.append(measure(threads))
    return {"what": "ampkit compare (defaults): torch's default thread count (OMP_NUM_THREADS) vs ampkit's default "
                    "(the digits task's cpu_threads=1), interleaved", "runs": runs}


THREADS_MARK = re.compile(r"<!-- compare-threads -->(.*?)<!-- /compare-threads -->", re.S)


def threads_sentence(data: dict) -> str:
    """README's words for the threads comparison: the ranges of each setting and the load they ran under."""
    def rng(vals: list[float]) -> str:
        lo, hi = min(vals), max(vals)
        return f"{lo:.0f} s" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f} s"

    one = [r for r in data["runs"] if r["omp_num_threads"] is None]  # ampkit's default: the task's one thread
    many = [r for r in data["runs"] if r["omp_num_threads"] is not None]
    loads = [x for r in data["runs"] for x in (r["machine"]["load_start"], r["machine"]["load_end"])]
    return (f"with one thread `ampkit compare` took {rng([r['cpu_s'] for r in one])} of CPU time and "
            f"{rng([r['wall_s'] for r in one])} of wall time against {rng([r['cpu_s'] for r in many])} and "
            f"{rng([r['wall_s'] for r in many])} with torch's default {many[0]['omp_num_threads']} threads "
            f"({len(data['runs'])} runs interleaved, load average {min(loads):.1f} to {max(loads):.1f}, measured "
            f"{one[0]['date']})" + _quiet_clause(data.get("quiet_runs") or []))


def _quiet_clause(runs: list[dict]) -> str:
    """The quiet machine's part of the threads comparison, when recorded: one thread costs nothing there."""
    if not runs:
        return ""
    one = [r["wall_s"] for r in runs if r["omp_num_threads"] is None]
    many = [r["wall_s"] for r in runs if r["omp_num_threads"] is not None]
    return (f"; on the same CPU when quiet, {min(one):.1f}-{max(one):.1f} s of wall time with one thread against "
            f"{min(many):.1f}-{max(many):.1f} s with {runs[0]['omp_num_threads']} ({len(runs)} runs interleaved)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", action="store_true", help="rewrite the pages from the JSON")
    ap.add_argument("--no-measure", action="store_true", help="only rewrite the pages from the existing JSON")
    ap.add_argument("--threads-comparison", type=int, metavar="ROUNDS", default=0,
                    help=f"only time default threads against OMP_NUM_THREADS=1, ROUNDS each, into {THREADS_RESULT.name}")
    args = ap.parse_args()
    if args.threads_comparison:
        THREADS_RESULT.write_text(json.dumps(threads_comparison(args.threads_comparison), indent=2) + "\n",
                                  encoding="utf-8")
        return
    if not args.no_measure:
        old = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.exists() else {}
        RESULT.write_text(json.dumps(record(old, measure()), indent=2) + "\n", encoding="utf-8")
    if args.pages or args.no_measure:
        write_pages(json.loads(RESULT.read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()
