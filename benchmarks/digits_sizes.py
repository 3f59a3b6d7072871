"""The README's main job (`ampkit compare`, digits) on a GPU, at several model sizes: verdict and speed-ups.

    OUT=/tmp/sizes PYTHONPATH=src python3 benchmarks/digits_sizes.py            # a few minutes on one H200
    OUT=/tmp/sizes PYTHONPATH=src python3 benchmarks/digits_sizes.py default     # only the default command

Each configuration is one `ampkit compare` through the CLI (exactly what a user types), bf16 unless named.
Writes into $OUT:
  digits-sizes.json   date, card, torch, git commit, and per configuration: the command, verdict, graphed and
                      eager speed-ups, samples/s, final accuracies, wall time
  compare-default.json the whole compare.json of the default command (`ampkit compare`, no options)
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

CONFIGS: dict[str, list[str]] = {
    "default": [],
    "default-fp16": ["--precision", "fp16"],
    "default-no-graph": ["--no-graph"],
    "small": ["--task-arg", "size=small"],
    "small-no-graph": ["--task-arg", "size=small", "--no-graph"],
    "h2048-b1024-3-layers": ["--task-arg", "hidden=2048", "--task-arg", "batch_size=1024", "--task-arg", "layers=3"],
    "h1024-b512": ["--task-arg", "hidden=1024", "--task-arg", "batch_size=512"],
}


def _compare(name: str, args: list[str], out: Path) -> dict:
    folder = Path("/tmp/digits-sizes") / name
    cmd = [sys.executable, "-m", "ampkit", "compare", *args, "--out", str(folder), "--json"]
    print("==", shlex.join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=300)
    wall = time.perf_counter() - t0
    row: dict = {"command": shlex.join(["ampkit", "compare", *args]), "exit": proc.returncode, "wall_s": wall}
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["error"] = proc.stdout[-2000:]
        return row
    if name == "default":
        (out / "compare-default.json").write_text(json.dumps(data, indent=1))
    ratios, thr, fm = data.get("ratios") or {}, data.get("throughput") or {}, data.get("final_metric") or {}
    row.update(verdict=data.get("verdict"), precision=data.get("precision"), task=data.get("task_description"),
               speedup=ratios.get("speedup"), speedup_eager=ratios.get("speedup_eager"),
               step_graph=ratios.get("step_graph"), samples_per_s=thr.get("per_seed"),
               accuracy={"fp32": fm.get("fp32"), "amp": fm.get("amp")}, notes=data.get("notes"),
               git_commit=(data.get("versions") or {}).get("git_commit"))
    return row


def main() -> int:
    out = Path(os.environ["OUT"])
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:] or list(CONFIGS)
    import torch

    rows = {}
    for name in names:
        rows[name] = _compare(name, CONFIGS[name], out)
        print(json.dumps({name: {k: rows[name].get(k) for k in ("verdict", "speedup", "speedup_eager", "wall_s")}}),
              file=sys.stderr, flush=True)
    summary = {"kind": "digits-sizes", "date": datetime.date.today().isoformat(),
               "card": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "git_commit": os.environ.get("AMPKIT_GIT_COMMIT"), "configs": rows}
    (out / "digits-sizes.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
