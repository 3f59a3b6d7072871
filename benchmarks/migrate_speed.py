"""CPU cost of ``ampkit migrate`` against ``ast.parse`` of the same files.

    PYTHONPATH=src python benchmarks/migrate_speed.py CORPUS [CORPUS ...] [--target musa]
        [--repeats 5] [--dense 20] [--out benchmarks/results/cpu-migrate-speed.json]

CORPUS is a folder (a fetched repository: diffusers' ``examples/``, say) or files; fetched repositories are
not committed, so the path is an argument and the JSON records it with each file's line count.

Two figures, each the median over ``--repeats`` runs with min/max (CPU time, ``time.process_time``, one
process, so a busy machine's other work does not count):

* **repository**: ``migrate_paths(CORPUS, jobs=1)`` as the CLI runs it (walk, read, the textual
  pre-filter, analysis) against reading and ``ast.parse``-ing every file it walks.
* **AMP-dense files**: the ``--dense`` files with the most AMP words per line (autocast, GradScaler,
  scaler., .cuda, torch.cuda, ...), each given to ``migrate_source``; the ratio is summed migrate time over
  summed ``ast.parse`` time, with the worst single file too.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings

import ampkit
from ampkit.migrate import migrate_paths, migrate_source
from ampkit.migrate.files import iter_python_files

_AMP_WORDS = re.compile(r"autocast|GradScaler|scaler\.|\.cuda\b|torch\.cuda|\.half\(\)|bfloat16|float16|"
                        r"clip_grad|\.backward\(|\.item\(\)|nccl|device_type")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeError):
        return None


def _parse_all(texts: dict[str, str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path, text in texts.items():
            try:
                ast.parse(text, path)
            except (SyntaxError, ValueError, RecursionError):
                pass


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 4) for v in values]}


def _repository(corpus: list[str], target: str, repeats: int) -> dict:
    files = [p for p, err in iter_python_files(corpus) if err is None]

    def read_and_parse() -> None:
        _parse_all({p: t for p in files if (t := _read(p)) is not None})

    migrate_times, parse_times = [], []
    results = None
    for _ in range(repeats):  # interleaved, so a change in the machine's load hits both alike
        parse_times.append(_cpu(read_and_parse))
        t0 = time.process_time()
        results = migrate_paths(corpus, target=target, jobs=1)
        migrate_times.append(time.process_time() - t0)
    lines = sum((_read(p) or "").count("\n") for p in files)
    ratios = [m / p for m, p in zip(migrate_times, parse_times)]
    return {"files": len(files), "lines": lines, "analysed": sum(r.analysed for r in results),
            "errors": sum(bool(r.error) for r in results), "changed": sum(r.changed for r in results),
            "findings": sum(len(r.findings) for r in results),
            "migrate_cpu_s": _stats(migrate_times), "ast_parse_cpu_s": _stats(parse_times),
            "ratio": _stats(ratios)}


def _dense(corpus: list[str], target: str, repeats: int, count: int) -> dict:
    texts = {p: t for p, err in iter_python_files(corpus) if err is None and (t := _read(p)) is not None}
    density = {p: len(_AMP_WORDS.findall(t)) / max(1, t.count("\n")) for p, t in texts.items()}
    chosen = sorted((p for p in texts if density[p] > 0), key=lambda p: -density[p])[:count]
    per_file: dict[str, list[tuple[float, float]]] = {p: [] for p in chosen}
    for _ in range(repeats):
        for p in chosen:
            text = texts[p]
            t_parse = _cpu(lambda: _parse_all({p: text}))
            try:
                t_mig = _cpu(lambda: migrate_source(text, target=target, filename=p))
            except Exception:  # noqa: BLE001 -- a file migrate refuses is timed as far as it got
                t_mig = float("nan")
            per_file[p].append((t_mig, t_parse))
    totals_m = [sum(per_file[p][i][0] for p in chosen) for i in range(repeats)]
    totals_p = [sum(per_file[p][i][1] for p in chosen) for i in range(repeats)]
    rows = []
    for p in chosen:
        m = statistics.median(x[0] for x in per_file[p])
        a = statistics.median(x[1] for x in per_file[p])
        n = texts[p].count("\n")
        rows.append({"path": os.path.relpath(p), "lines": n, "amp_words_per_line": round(density[p], 3),
                     "migrate_ms": round(m * 1e3, 2), "ast_parse_ms": round(a * 1e3, 2),
                     "ratio": round(m / a, 1) if a else None, "ms_per_line": round(m * 1e3 / max(1, n), 3)})
    return {"files": len(chosen), "lines": sum(r["lines"] for r in rows),
            "migrate_cpu_s": _stats(totals_m), "ast_parse_cpu_s": _stats(totals_p),
            "ratio": _stats([m / p for m, p in zip(totals_m, totals_p)]),
            "worst_file_ratio": max((r["ratio"] or 0) for r in rows) if rows else None, "per_file": rows}


def _commit() -> str:
    """The commit of the ampkit being measured (the tree it is imported from)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(ampkit.__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="+", help="folders or files to migrate (a fetched repository)")
    ap.add_argument("--target", default="musa", choices=("agnostic", "cuda", "musa"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dense", type=int, default=20, help="how many AMP-dense files to time one by one")
    ap.add_argument("--label", default="", help="a name for this run in the JSON (before/after, say)")
    ap.add_argument("--out", default=None, help="append the result to this JSON file's runs")
    args = ap.parse_args(argv)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "label": args.label, "commit": _commit(), "machine": platform.node(), "cpu": platform.processor()
        or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "corpus": [os.path.abspath(c) for c in args.corpus], "target": args.target, "repeats": args.repeats,
        "repository": _repository(args.corpus, args.target, args.repeats),
        "dense": _dense(args.corpus, args.target, args.repeats, args.dense),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:  # {"kind": "migrate-speed", "runs": [...]}, the form render_benchmarks.py reads
        data = {"kind": "migrate-speed", "benchmark": "benchmarks/migrate_speed.py", "runs": []}
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as fh:
                data = json.load(fh)
        data["runs"].append(record)
        data["git_commit"], data["date"] = record["commit"], record["date"]
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
    rep, dense = record["repository"]["ratio"]["median"], record["dense"]["ratio"]["median"]
    print(f"repository: {rep:.1f}x ast.parse; AMP-dense files: {dense:.1f}x", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
