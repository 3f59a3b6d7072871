#!/usr/bin/env bash
# The one entry point for recording GPU figures: named workloads, run in the order given, each writing
# its JSON (or log) into $OUT, with one steps.txt that says what ran, its exit status and seconds.
#
#   OUT=/tmp/out TAG=h200-2026-12-02 bash benchmarks/record_gpu.sh gpu-tests compare-digits bench-gpt2
#   bash benchmarks/record_gpu.sh --list                       # the workloads and what each records
#
# TAG prefixes every result file (default: the card and today's date). AMPKIT_GIT_COMMIT names the
# commit sent (the device tool's copy of the tree has a stale .git). Workloads that need torchao install
# it from .whl/ when it is not importable (carry .whl; see docs/contributing.md). The device tool brings
# back at most 8 files: a call records a few workloads. Then stamp and render (docs/contributing.md):
#   python benchmarks/render_benchmarks.py --stamp benchmarks/results/FILE.json && python benchmarks/render_benchmarks.py
set -uo pipefail
PY=${PY:-python3}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | awk '{print tolower($NF)}')
TAG=${TAG:-${CARD:-gpu}-$(date -u +%Y-%m-%d)}
CHARLM="--task charlm --task-arg d_model=256 --task-arg n_layers=4 --task-arg seq_len=256"
# libcst is not installed there: migrate's tests (and the registry test that imports migrate) stay on the CPU.
GPU_TESTS="-m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed --ignore=tests/migrate
  --ignore=tests/diagnose/test_findings_registry.py"

declare -A WHAT=(
  [gpu-tests]="python -m pytest -m gpu: every single-GPU test (with torchao when carried)"
  [doctor]="ampkit doctor --json"
  [compare-digits]="ampkit compare (the main job: digits, sized for the device), BF16"
  [compare-digits-fp16]="ampkit compare --precision fp16"
  [compare-charlm]="ampkit compare on charlm d256, BF16"
  [compare-fp8]="ampkit compare on charlm d256, FP8 (torchao), 2 seeds of 200 steps (refused in one line where the plan finds no layer that pays: fp8-plan-compare runs a model big enough)"
  [fp8-plan-probe]="benchmarks/fp8_plan_h200.py probe: the FP8 cost model per recipe and mode (issue 33)"
  [fp8-plan-gpt2]="benchmarks/fp8_plan_h200.py gpt2: bench gpt2-small BF16 vs FP8 with the plan, eager+compiled"
  [fp8-plan-gpt2-eligible]="benchmarks/fp8_plan_h200.py gpt2-eligible: FP8 on every eligible layer, compiled"
  [fp8-plan-llama-eager]="benchmarks/fp8_plan_h200.py llama-eager: llama-1b BF16 vs FP8, eager"
  [fp8-plan-llama-compiled]="benchmarks/fp8_plan_h200.py llama-compiled: llama-1b BF16 vs FP8, compiled"
  [fp8-plan-llama-rowwise]="benchmarks/fp8_plan_h200.py llama-rowwise: llama-1b rowwise recipes, compiled"
  [fp8-plan-compare]="benchmarks/fp8_plan_h200.py compare: compare --precision fp8 on charlm d2048"
  [bench-gpt2]="ampkit bench gpt2-small BF16+FP16, eager and compiled, plain/ampkit/graph, 3 rounds"
  [bench-gpt2-peers]="ampkit bench gpt2-small BF16+FP16 compiled with every peer (Accelerate, Fabric)"
  [bench-gpt2-fp32]="ampkit bench gpt2-small FP32 and TF32, eager"
  [bench-gpt2-fp8]="ampkit bench gpt2-small BF16 and FP8, compiled"
  [bench-resnet50]="ampkit bench resnet50 BF16+FP16, plain/ampkit, 7 rounds"
  [bench-hf-gpt2]="ampkit bench hf-gpt2 BF16+FP16, plain/ampkit, 5 rounds"
  [bench-lesson-graph]="ampkit bench the lesson's model: whole-step graph vs the lesson's loop"
  [bench-digits-graph]="ampkit bench digits: whole-step graph vs eager"
  [digits-sizes]="benchmarks/digits_sizes.py: the main job at several model sizes"
  [explain]="benchmarks/explain_h200.py: compare --explain on charlm"
  [distributed]="benchmarks/run_h200_distributed.sh: DDP/FSDP2 with NCCL, 1 vs 2 GPUs (2-GPU machine)"
)

step() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  [ $rc = 0 ] && [ "${KEEP_LOGS:-0}" = 0 ] && [ "$name" != gpu-tests ] && rm -f "$OUT/$name.log"
  return 0
}

torchao() {
  $PY -c "import torchao" 2>/dev/null || $PY -m pip install --no-deps -q .whl/torchao-*.whl >> "$LOG" 2>&1
}

bench() {  # name limit ampkit-bench-arguments...
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" $PY -m ampkit bench "$@" --json --out "$OUT/$TAG-$name.json"
}

compare() {  # name limit ampkit-compare-arguments...
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" $PY -m ampkit compare "$@" --json --out "/tmp/record-$name"
  cp "/tmp/record-$name/compare.json" "$OUT/$TAG-$name.json" 2>/dev/null
}

run() {
  case "$1" in
    gpu-tests) torchao; step gpu-tests 240 $PY -m pytest $GPU_TESTS ;;
    doctor) step doctor 60 sh -c "$PY -m ampkit doctor --json > '$OUT/$TAG-doctor.json'" ;;
    compare-digits) compare compare-digits 150 ;;
    compare-digits-fp16) compare compare-digits-fp16 150 --precision fp16 ;;
    compare-charlm) compare compare-charlm 180 $CHARLM --precision bf16 ;;
    compare-fp8) torchao; compare compare-fp8 240 $CHARLM --precision fp8 --seeds 2 --steps 200 --no-audit ;;
    bench-gpt2) bench bench-gpt2 330 --model gpt2-small --precision bf16 fp16 --compile --graph \
        --runners plain,ampkit,ampkit-graph --rounds 3 ;;
    bench-gpt2-peers) bench bench-gpt2-peers 420 --model gpt2-small --precision bf16 fp16 --compile ;;
    bench-gpt2-fp32) bench bench-gpt2-fp32 240 --model gpt2-small --precision fp32 tf32 --steps 10 --warmup 2 ;;
    bench-gpt2-fp8) torchao; bench bench-gpt2-fp8 420 --model gpt2-small --precision bf16 fp8 --compile \
        --runners plain,ampkit ;;
    bench-resnet50) bench bench-resnet50 150 --model resnet50 --precision bf16 fp16 --runners plain,ampkit --rounds 7 ;;
    bench-hf-gpt2) bench bench-hf-gpt2 150 --model hf-gpt2 --precision bf16 fp16 --runners plain,ampkit --rounds 5 ;;
    bench-lesson-graph) bench bench-lesson-graph 120 --model lesson --precision fp16 bf16 --graph --steps 200 \
        --warmup 20 ;;
    bench-digits-graph) bench bench-digits-graph 120 --model digits --precision fp16 bf16 --graph \
        --runners plain,ampkit,ampkit-graph,lesson --steps 100 --warmup 10 ;;
    fp8-plan-*) step "$1" 600 env OUT="$OUT" TAG="$TAG" $PY benchmarks/fp8_plan_h200.py "${1#fp8-plan-}" ;;
    digits-sizes) step digits-sizes 300 env OUT="$OUT" $PY benchmarks/digits_sizes.py ;;
    explain) step explain 400 env OUT="$OUT" EXPLAIN_ARGS="--seeds 2" $PY benchmarks/explain_h200.py ;;
    distributed) step distributed 400 env OUT="$OUT" bash benchmarks/run_h200_distributed.sh ;;
    *) echo "unknown workload '$1': bash benchmarks/record_gpu.sh --list" | tee -a "$LOG"; return 2 ;;
  esac
}

if [ $# = 0 ] || [ "$1" = --list ]; then
  for name in $(printf '%s\n' "${!WHAT[@]}" | sort); do printf '  %-20s %s\n' "$name" "${WHAT[$name]}"; done
  exit 0
fi
OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
LOG="$OUT/steps.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  for m in torchvision transformers accelerate lightning torchao; do
    $PY -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
  echo "commit ${AMPKIT_GIT_COMMIT:-unknown}"; } >> "$LOG" 2>&1
for workload in "$@"; do run "$workload"; done
cat "$LOG"
