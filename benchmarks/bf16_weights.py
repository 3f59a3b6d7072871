"""BF16 weights with exact updates (``--weights bf16``) against FP32-weight autocast and pure BF16, on the CPU:
the bytes each mode stores per parameter, counted on the live tensors after real steps, and the verdict of
``ampkit compare`` on the built-in language model (charlm) for pure BF16 and for ``--weights bf16``.

    python benchmarks/bf16_weights.py                  # writes benchmarks/results/cpu-bf16-weights.json
    python benchmarks/bf16_weights.py --seeds 5 --lr 3e-4

The compares use the charlm task as shipped (AdamW, lr 3e-3) and once at a lower learning rate, where updates
are smaller relative to the weights and pure BF16 rounds more of them away.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "cpu-bf16-weights.json"


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t) or t.dim() == 0 or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def stored_bytes(weights: str, steps: int = 3) -> dict:
    """Train charlm's model a few steps in ``weights`` mode and count what stays stored between steps: weights,
    remainders, gradients (as they are just before the optimizer step) and optimizer states, per parameter."""
    from ampkit.engine import MixedPrecision
    from ampkit.tasks import load_task

    task = load_task("charlm", seed=0)
    model = task.model
    amp = MixedPrecision("bf16", weights=weights, device="cpu")
    amp.attach(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grad_bytes = 0
    for i in range(steps):
        batch = task.batch(i)
        with amp.autocast():
            loss = task.loss(model, batch)
        amp.backward(loss)
        grad_bytes = _tensor_bytes(p.grad for p in model.parameters())
        amp.step(opt)
    n = sum(p.numel() for p in model.parameters())
    parts = {"weight": _tensor_bytes(model.parameters()),
             "remainder": amp.master.remainder_bytes if amp.master is not None else 0,
             "gradient": grad_bytes,
             "states": _tensor_bytes(v for s in opt.state.values() for v in s.values())}
    return {"parameters": n, "bytes_per_parameter": {k: round(v / n, 3) for k, v in parts.items()},
            "total_per_parameter": round(sum(parts.values()) / n, 3)}


def compare(weights: str, seeds: int, lr: float | None, steps: int | None) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ampkit", "compare", "--task", "charlm", "--precision", "bf16", "--weights",
               weights, "--seeds", str(seeds), "--out", f"{out}/c", "--no-audit"]
        if lr is not None:
            cmd += ["--lr", str(lr)]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        path = Path(out) / "c" / "compare.json"
        if not path.exists():
            return {"command": " ".join(cmd[1:]), "exit_code": proc.returncode, "error": proc.stderr[-500:]}
        data = json.loads(path.read_text())
    shown = [a for i, a in enumerate(cmd[3:]) if a not in ("--out", "--no-audit") and cmd[3:][i - 1] != "--out"]
    return {"command": "ampkit " + " ".join(shown), "exit_code": proc.returncode, "verdict": data["verdict"],
            "reasons": data.get("reasons"), "seeds": seeds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, nargs="*", default=[None, 3e-4])
    ap.add_argument("--skip-compare", action="store_true")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    data = {"kind": "bf16-weights-cpu", "date": datetime.date.today().isoformat(), "git_commit": commit, "torch": torch.__version__,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "load_start": round(os.getloadavg()[0], 1)},
            "stored": {w: stored_bytes(w) for w in ("fp32", "bf16", "bf16-pure")}}
    if not args.skip_compare:
        data["compare"] = [compare(w, args.seeds, lr, args.steps) for lr in args.lr for w in ("bf16-pure", "bf16")]
    data["machine"]["load_end"] = round(os.getloadavg()[0], 1)
    RESULT.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({k: v for k, v in data.items() if k != "compare"}, indent=1))
    for c in data.get("compare", []):
        print(c.get("command"), "->", c.get("verdict"), c.get("exit_code"))


if __name__ == "__main__":
    main()
