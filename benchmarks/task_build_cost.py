"""What building the 2.21B ``llama`` task costs each run of ``compare``: on the host and then moved (as before),
against on the run's device (the factory's ``device``), with the initial-weights copy either way.

    python benchmarks/task_build_cost.py OUT.json      # on a machine with an accelerator

Recorded: benchmarks/results/h200-2026-12-02-logs/task-build-cost.json (one H200, 16 host cores, torch 2.11):
host build and move 33.6-35.6 s, on the device 0.1-0.3 s; the initial weights copied to the host 6.0-7.2 s.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import ampkit
from ampkit.device import detect_device

SHAPE = {"d_model": 3072, "n_layers": 20, "n_heads": 24, "n_kv_heads": 8, "ffn": 8192, "vocab_size": 32000,
         "seq_len": 2048, "batch_size": 2, "corpus_bytes": 4_000_000, "eval_windows": 32}


def _sync(dev: torch.device) -> None:
    if dev.type != "cpu":
        torch.accelerator.synchronize()


def one(where: str, dev: torch.device) -> dict[str, float]:
    t0 = time.perf_counter()
    task = ampkit.load_task("llama", seed=0, options=SHAPE, device=dev if where == "device" else None)
    model = task.model.to(dev)
    _sync(dev)
    t1 = time.perf_counter()
    inits = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    t2 = time.perf_counter()
    model.load_state_dict(inits)
    _sync(dev)
    t3 = time.perf_counter()
    del task, model, inits
    if dev.type != "cpu":
        torch.accelerator.empty_cache()
    return {"build_and_move_s": t1 - t0, "copy_to_host_s": t2 - t1, "load_s": t3 - t2}


def main(out: str) -> None:
    dev = detect_device().torch_device
    rows = {where: [one(where, dev) for _ in range(2)] for where in ("host", "device")}
    json.dump({"kind": "task-build-cost", "device": torch.accelerator.current_accelerator().type
               if torch.accelerator.is_available() else "cpu", "torch": torch.__version__,
               "threads": torch.get_num_threads(), "shape": SHAPE, "rounds": rows}, open(out, "w"), indent=1)
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1])
