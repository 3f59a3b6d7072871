"""`ampkit compare --explain` on the H200 configuration of issue 20, and a rerun with its recommendation.

    OUT=/tmp/explain PYTHONPATH=src python3 benchmarks/explain_h200.py      # about 5 minutes on one H200

Writes into $OUT (4 files):
  h200-explain-charlm.json        the compare.json of `ampkit compare --task charlm --task-arg d_model=256
                                  --task-arg n_layers=4 --task-arg seq_len=256 --precision bf16 --steps 600
                                  --explain` (verdict, ranking, candidates, recommendation)
  h200-explain-charlm-rerun.json  the compare.json of the same comparison with the recommended flags (when
                                  there is a recommendation): does the user's copy-paste give PASS?
  h200-explain-summary.json       date, card, torch, git commit, both verdicts, wall times, the summary lines
  h200-explain-report.html        the HTML report of the --explain run (per-module error plot)
Each command's progress goes to stderr. Extra compare flags: EXPLAIN_ARGS="--seeds 2" (default: 3 seeds).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

BASE = ["--task", "charlm", "--task-arg", "d_model=256", "--task-arg", "n_layers=4", "--task-arg", "seq_len=256",
        "--precision", "bf16", "--steps", "600", "--no-audit"]


def _compare(args: list[str], folder: Path) -> tuple[int, dict, float]:
    cmd = [sys.executable, "-m", "ampkit", "compare", *args, "--out", str(folder), "--json"]
    print("==", shlex.join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = {"error": proc.stdout[-2000:]}
    print(f"== exit {proc.returncode} after {wall:.0f} s", file=sys.stderr, flush=True)
    return proc.returncode, data, wall


def _environment() -> dict:
    import torch

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "git_commit": commit}


def main() -> int:
    out = Path(os.environ.get("OUT", "benchmarks/results/latest"))
    out.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(os.environ.get("EXPLAIN_ARGS", ""))
    runs = Path(os.environ.get("RUNS", "/tmp/ampkit-explain-runs"))  # report folders: outside $OUT (8 files back)
    code, first, wall = _compare([*BASE, *extra, "--explain"], runs / "explain")
    if (runs / "explain" / "report.html").exists():
        shutil.copyfile(runs / "explain" / "report.html", out / "h200-explain-report.html")
    (out / "h200-explain-charlm.json").write_text(json.dumps(first, indent=2) + "\n")
    summary = {**_environment(), "command": "ampkit compare " + shlex.join([*BASE, *extra, "--explain"]),
               "exit": code, "verdict": first.get("verdict"), "reasons": first.get("reasons"), "wall_s": wall}
    explain = first.get("explain") or {}
    summary.update(explain_wall_s=explain.get("wall_s"), explain_budget_s=explain.get("budget_s"),
                   summary=explain.get("summary"), notes=explain.get("notes"),
                   top_modules=[(m["module"], m["added"]) for m in explain.get("ranking", [])[:5]])
    rec = explain.get("recommendation")
    summary["recommendation"] = rec
    if rec:
        code2, second, wall2 = _compare([*BASE, *extra, *shlex.split(rec["flags"])], runs / "rerun")
        (out / "h200-explain-charlm-rerun.json").write_text(json.dumps(second, indent=2) + "\n")
        summary.update(rerun_command="ampkit compare " + shlex.join([*BASE, *extra, *shlex.split(rec["flags"])]),
                       rerun_exit=code2, rerun_verdict=second.get("verdict"), rerun_reasons=second.get("reasons"),
                       rerun_wall_s=wall2)
    (out / "h200-explain-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary.get(k) for k in ("verdict", "recommendation", "rerun_verdict")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
