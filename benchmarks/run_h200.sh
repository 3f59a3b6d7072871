#!/usr/bin/env bash
# Every figure the H200 bars need (BENCHMARKS.md), in one go: about 4-5 minutes on a 2 x H200 machine
# (two lanes, one per GPU; with one GPU, LANES=1 runs them one after the other, about 7 minutes).
#
#   OUT=/tmp/h200 benchmarks/run_h200.sh        # JSON results + one log under $OUT
#
# Writes (at most 8 files, the device tool's limit):
#   h200-gpt2-small-amp.json   gpt2-small, bf16 + fp16, eager + compiled: overhead, MFU, fp16 vs bf16,
#                              syncs, peak memory, peers (Accelerate, Lightning Fabric)
#   h200-gpt2-small-fp32.json  gpt2-small, fp32 + tf32, eager
#   h200-lesson-graph.json     the lesson's 5-4-3 model: whole-step graph vs the lesson's loop
#   h200-digits-graph.json     digits: whole-step graph vs eager
#   gpu-tests.log              python -m pytest -m gpu tests/bench (same losses, no host syncs)
#   run.log                    every command's progress lines and the environment
#   (MAXTUNE=1 adds h200-gpt2-small-maxtune.json: BF16 compiled with max-autotune-no-cudagraphs)
set -u
OUT=${OUT:-benchmarks/results/latest}
LANES=${LANES:-2}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/run.log"
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
} >>"$LOG" 2>&1

bench() {  # bench GPU NAME TIMEOUT ARGS...
  local gpu=$1 name=$2 limit=$3; shift 3
  echo "== [gpu $gpu] ampkit bench $* --json > $name.json" >>"$LOG"
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" $PY -m ampkit bench "$@" --json >"$OUT/$name.json" 2>>"$LOG"
  echo "== [gpu $gpu] $name: exit $? after $((SECONDS - t0)) s" >>"$LOG"
}

lane0() {
  bench 0 h200-gpt2-small-amp 420 --model gpt2-small --precision bf16 fp16 --compile
  if [ "${MAXTUNE:-0}" = 1 ]; then  # optional, several minutes of autotuning: the MFU bar's next step
    bench 0 h200-gpt2-small-maxtune 540 --model gpt2-small --precision bf16 --compile --no-eager \
      --compile-mode max-autotune-no-cudagraphs
  fi
}
lane1() {
  local gpu=1; [ "$LANES" = 1 ] && gpu=0
  bench $gpu h200-lesson-graph 120 --model lesson --precision fp16 bf16 --graph --steps 200 --warmup 20
  bench $gpu h200-digits-graph 120 --model digits --precision fp16 bf16 --graph --runners plain,ampkit,ampkit-graph,lesson --steps 100 --warmup 10
  echo "== [gpu $gpu] pytest -m gpu tests/bench" >>"$LOG"
  CUDA_VISIBLE_DEVICES=$gpu timeout 240 $PY -m pytest -m gpu tests/bench -q -rA -p no:cacheprovider >"$OUT/gpu-tests.log" 2>&1
  echo "== [gpu $gpu] gpu tests: exit $?" >>"$LOG"
  bench $gpu h200-gpt2-small-fp32 240 --model gpt2-small --precision fp32 tf32 --steps 10 --warmup 2
}

if [ "$LANES" = 1 ]; then
  lane1; lane0
else
  lane1 & pid=$!
  lane0
  wait $pid
fi
echo "== done" >>"$LOG"
