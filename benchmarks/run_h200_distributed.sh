#!/usr/bin/env bash
# ampkit on two GPUs of one host (the nvidia-h200-x2 machine): the distributed tests with NCCL in BF16
# and FP16, then charlm scaled up (GPT-2-small shape) on 1 GPU vs 2 GPUs (DDP and FSDP2, BF16).
#
#   OUT=/path/to/results bash benchmarks/run_h200_distributed.sh      # from the repository root
#
# Needs python3 with torch (CUDA) and pytest; ampkit is taken from src/ (PYTHONPATH=src), no install.
# Writes $OUT/h200x2-distributed.json (the summary: tests, throughput, scaling efficiency) and the logs
# and metrics of every run beside it. Takes about 3 minutes; every step has a time limit (< 5 minutes).
set -uo pipefail

# The machine requires NVLink multicast off (NVLS in NCCL, multicast in symmetric memory).
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
OUT="${OUT:?set OUT to the folder for results}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
START=$(date +%s)

# 1. The gpu-marked distributed tests: 2 ranks vs 1 GPU (losses), skip agreement with an inf on one
#    rank, FSDP2 checkpoint resumed on 1 and 2 GPUs, a killed rank restarted by torchrun.
timeout 170 "$PY" -m pytest -m "gpu or multi_gpu" tests/distributed -q -rA -p no:cacheprovider \
    --junitxml="$OUT/distributed-tests.xml" > "$OUT/distributed-tests.log" 2>&1
echo $? > "$OUT/distributed-tests.rc"
tail -n 5 "$OUT/distributed-tests.log"

# 2. Throughput, weak scaling: the same 16 sequences of 1024 bytes per GPU (the task's batch is the
#    global batch: 16 on one GPU, 32 on two). BF16, fused AdamW, clipping on, 40 steps, logged every 10.
MODEL=(--task charlm --task-arg d_model=768 --task-arg n_layers=12 --task-arg n_heads=12
       --task-arg seq_len=1024 --task-arg vocab_size=50304 --task-arg corpus_bytes=2000000)
PER_GPU=16
bench() {  # name, then ampkit train arguments
    local name=$1; shift
    if (( $(date +%s) - START > 230 )); then echo "skipped: time budget" > "$OUT/bench-$name.log"; echo 124 > "$OUT/bench-$name.rc"; return; fi
    timeout 90 "$PY" -m ampkit train "${MODEL[@]}" --precision bf16 --steps 40 --log-every 10 \
        --out "$OUT/bench-$name" --device cuda "$@" > "$OUT/bench-$name.log" 2>&1
    echo $? > "$OUT/bench-$name.rc"
    tail -n 3 "$OUT/bench-$name.log"
}
bench 1gpu --task-arg batch_size=$PER_GPU
bench 2gpu-ddp --task-arg batch_size=$((2 * PER_GPU)) --nproc 2 --strategy ddp
bench 2gpu-fsdp --task-arg batch_size=$((2 * PER_GPU)) --nproc 2 --strategy fsdp

# 3. The summary.
OUT="$OUT" PER_GPU=$PER_GPU START=$START timeout 60 "$PY" - <<'EOF'
import json, os, time, xml.etree.ElementTree as ET
from pathlib import Path

import torch

out, per_gpu = Path(os.environ["OUT"]), int(os.environ["PER_GPU"])
seq_len, d_model, n_layers, vocab = 1024, 768, 12, 50304


def rc(name):
    p = out / f"{name}.rc"
    return int(p.read_text().strip()) if p.exists() else None


tests = {"rc": rc("distributed-tests")}
xml = out / "distributed-tests.xml"
if xml.exists():
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    tests["cases"] = {
        f"{c.get('name')}": ("failed" if c.find("failure") is not None or c.find("error") is not None
                             else "skipped" if c.find("skipped") is not None else "passed")
        for c in suite.iter("testcase")
    }

# charlm's own count: 6 * params * tokens + attention (ampkit.tasks.charlm); params without positions.
n_params = vocab * d_model + n_layers * (12 * d_model * d_model + 13 * d_model) + 2 * d_model
runs = {}
for name, gpus in (("1gpu", 1), ("2gpu-ddp", 2), ("2gpu-fsdp", 2)):
    rec = {"gpus": gpus, "rc": rc(f"bench-{name}"), "global_batch": per_gpu * gpus, "seq_len": seq_len}
    metrics = out / f"bench-{name}" / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        steady = [r["samples_per_s"] for r in rows[1:] if r.get("samples_per_s")]  # first window: warm-up
        if steady:
            sps = sum(steady) / len(steady)
            tokens = sps * seq_len
            flops = 6 * n_params * tokens + 12 * n_layers * d_model * seq_len * tokens
            rec.update(samples_per_s=sps, tokens_per_s=tokens, tokens_per_s_per_gpu=tokens / gpus,
                       tflops_per_gpu=flops / gpus / 1e12, windows=len(steady),
                       final_loss=rows[-1].get("loss"), skipped=rows[-1].get("skipped"),
                       peak_mem_gib=(rows[-1].get("peak_mem_bytes") or 0) / 2**30)
    runs[name] = rec

one = runs["1gpu"].get("samples_per_s")
scaling = {}
for name in ("2gpu-ddp", "2gpu-fsdp"):
    two = runs[name].get("samples_per_s")
    if one and two:
        scaling[name] = {"speedup": two / one, "efficiency": two / (2 * one)}

props = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
nccl = None
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:  # noqa: BLE001
    pass
summary = {
    "machine": "nvidia-h200-x2",
    "gpus": props,
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "nccl": nccl,
    "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
    "model": {"task": "charlm", "d_model": d_model, "n_layers": n_layers, "n_heads": 12, "seq_len": seq_len,
              "vocab_size": vocab, "params": n_params, "precision": "bf16", "per_gpu_batch": per_gpu,
              "steps": 40, "log_every": 10},
    "tests": tests,
    "throughput": runs,
    "scaling": scaling,
    "wall_s": time.time() - float(os.environ["START"]),
}
(out / "h200x2-distributed.json").write_text(json.dumps(summary, indent=2))
print(json.dumps({"tests": {k: v for k, v in tests.items() if k != "cases"}, "scaling": scaling}, indent=2))
EOF
