#!/usr/bin/env bash
# The 2026-12-01 recording run on one H200 (the device tool's nvidia-h200), in parts that each fit one
# 10-minute call. Each part writes its JSON and logs into $OUT (at most 8 files come back).
#
#   OUT=/tmp/out bash benchmarks/h200_session.sh a   # GPU tests; bench gpt2-small eager + compiled (rounds)
#   OUT=/tmp/out bash benchmarks/h200_session.sh b   # GPU tests; bench resnet50 / hf-gpt2; compare digits
#   OUT=/tmp/out bash benchmarks/h200_session.sh c   # compare charlm d256; --explain (benchmarks/explain_h200.py)
#   OUT=/tmp/out bash benchmarks/h200_session.sh d   # GPU tests; the main job at several digits sizes
#                                                    # (benchmarks/digits_sizes.py); bench gpt2-small bf16, 1 round
#   OUT=/tmp/out bash benchmarks/h200_session.sh e   # GPU tests with torchao (carry .whl); compare charlm d256;
#                                                    # bench gpt2-small compiled with max-autotune-no-cudagraphs
#   OUT=/tmp/out bash benchmarks/h200_session.sh f   # FP8 and graph GPU tests (carry .whl); compare charlm d256 in FP8
# The device's copy of the tree has a stale .git: pass AMPKIT_GIT_COMMIT=<the commit you sent>.
set -uo pipefail
PART=${1:?part a, b, c, d, e or f}
OUT=${OUT:?set OUT}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
LOG="$OUT/steps-$PART.txt"
step() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$LOG"
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  for m in torchvision transformers accelerate lightning torchao; do
    $PY -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
  echo "commit ${AMPKIT_GIT_COMMIT:-unknown}"; } >> "$LOG" 2>&1
if [ "$PART" = a ]; then
  step bench-gpt2 330 $PY -m ampkit bench --model gpt2-small --precision bf16 fp16 --compile --graph \
      --runners plain,ampkit,ampkit-graph --rounds 3 --json --out "$OUT/h200-2026-12-01-gpt2-small.json"
elif [ "$PART" = b ]; then
  # libcst is not installed there: migrate's tests (and the registry test that imports migrate) stay on the CPU.
  step gpu-tests 170 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed \
      --ignore=tests/migrate --ignore=tests/diagnose/test_findings_registry.py
  tail -45 "$OUT/gpu-tests.log" >> "$LOG"
  step bench-resnet50 110 $PY -m ampkit bench --model resnet50 --precision bf16 fp16 --runners plain,ampkit \
      --rounds 7 --json --out "$OUT/h200-2026-12-01-resnet50.json"
  step bench-hf-gpt2 110 $PY -m ampkit bench --model hf-gpt2 --precision bf16 fp16 --runners plain,ampkit \
      --rounds 5 --json --out "$OUT/h200-2026-12-01-hf-gpt2.json"
  step compare-digits 120 $PY -m ampkit compare --json --out /tmp/cmp-digits
  cp /tmp/cmp-digits/compare.json "$OUT/h200-2026-12-01-compare-digits.json" 2>/dev/null
  rm -f "$OUT"/compare-*.log  # the JSON has it all: at most 8 files come back
elif [ "$PART" = d ]; then
  step gpu-tests 200 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed \
      --ignore=tests/migrate --ignore=tests/diagnose/test_findings_registry.py
  tail -50 "$OUT/gpu-tests.log" >> "$LOG"
  step digits-sizes 240 env OUT="$OUT" $PY benchmarks/digits_sizes.py
  step bench-gpt2 150 $PY -m ampkit bench --model gpt2-small --precision bf16 --graph \
      --runners plain,ampkit,ampkit-graph --json --out "$OUT/h200-2026-12-01-gpt2-small-d.json"
  rm -f "$OUT"/digits-sizes.log "$OUT"/bench-gpt2.log
elif [ "$PART" = e ]; then
  $PY -m pip install --no-deps -q .whl/torchao-*.whl >> "$LOG" 2>&1
  step gpu-tests 200 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed \
      --ignore=tests/migrate --ignore=tests/diagnose/test_findings_registry.py
  tail -50 "$OUT/gpu-tests.log" >> "$LOG"
  step compare-charlm 150 $PY -m ampkit compare --task charlm --task-arg d_model=256 --task-arg n_layers=4 \
      --task-arg seq_len=256 --precision bf16 --json --out /tmp/cmp-charlm
  cp /tmp/cmp-charlm/compare.json "$OUT/h200-2026-12-01-compare-charlm-d256-e.json" 2>/dev/null
  step bench-gpt2-autotune 330 $PY -m ampkit bench --model gpt2-small --precision bf16 --compile --no-eager \
      --compile-mode max-autotune-no-cudagraphs --runners plain,ampkit --json \
      --out "$OUT/h200-2026-12-01-gpt2-small-autotune.json"
  rm -f "$OUT"/compare-charlm.log
elif [ "$PART" = f ]; then
  $PY -m pip install --no-deps -q .whl/torchao-*.whl >> "$LOG" 2>&1
  step gpu-tests 150 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_fp8.py tests/test_train_graph.py
  tail -30 "$OUT/gpu-tests.log" >> "$LOG"
  step compare-fp8 200 $PY -m ampkit compare --task charlm --task-arg d_model=256 --task-arg n_layers=4 \
      --task-arg seq_len=256 --precision fp8 --seeds 2 --steps 200 --no-audit --json --out /tmp/cmp-fp8
  cp /tmp/cmp-fp8/compare.json "$OUT/h200-2026-12-01-compare-charlm-fp8-graph.json" 2>/dev/null
else
  step compare-charlm 150 $PY -m ampkit compare --task charlm --task-arg d_model=256 --task-arg n_layers=4 \
      --task-arg seq_len=256 --precision bf16 --json --out /tmp/cmp-charlm
  cp /tmp/cmp-charlm/compare.json "$OUT/h200-2026-12-01-compare-charlm-d256.json" 2>/dev/null
  step explain 400 env OUT="$OUT" EXPLAIN_ARGS="--seeds 2" $PY benchmarks/explain_h200.py
  rm -f "$OUT/explain.log"
fi
cat "$LOG"
