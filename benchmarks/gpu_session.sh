#!/usr/bin/env bash
# The recording run on a 2 x H200 machine (the device tool's nvidia-h200-x2), in three parts that each
# fit one 10-minute call. Results go to one archive, $OUT/gpu-part-N.tgz.
#
#   OUT=/tmp/out bash benchmarks/gpu_session.sh 1   # doctor, compare BF16/FP16, diagnose on CUDA, gpu tests
#   OUT=/tmp/out bash benchmarks/gpu_session.sh 2   # benchmarks/run_h200.sh (the bars of BENCHMARKS.md)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh 3   # benchmarks/run_h200_distributed.sh (NCCL, 1 vs 2 GPUs)
set -uo pipefail
PART=${1:?part 1 or 2}
OUT=${OUT:?set OUT}
RES=/tmp/ampkit-gpu-part-$PART
rm -rf "$RES"; mkdir -p "$RES"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
step() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$RES/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$RES/steps.txt"
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$RES/env.txt" 2>&1
if [ "$PART" = 1 ]; then
  export CUDA_VISIBLE_DEVICES=0
  step doctor 60 $PY -m ampkit doctor
  step doctor-json 60 $PY -m ampkit doctor --json
  step doctor-fp16 60 $PY -m ampkit doctor --precision fp16
  step compare-bf16 150 $PY -m ampkit compare --precision bf16 --out "$RES/compare-bf16"
  step compare-fp16 150 $PY -m ampkit compare --precision fp16 --out "$RES/compare-fp16"
  step diagnose-host-sync 60 $PY -m ampkit diagnose --json "$RES/diagnose-host-sync.json" tests/diagnose/scripts/host_sync.py cuda
  step gpu-tests 150 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed --ignore=tests/bench --ignore=tests/migrate
elif [ "$PART" = 2 ]; then
  step run-h200 540 env OUT="$RES/bench" bash benchmarks/run_h200.sh
else
  CUDA_VISIBLE_DEVICES=0 step gpu-tests 150 $PY -m pytest -m gpu -q -rA -p no:cacheprovider tests --ignore=tests/distributed \
      --ignore=tests/bench --ignore=tests/migrate
  step run-h200-distributed 330 env OUT="$RES/distributed" bash benchmarks/run_h200_distributed.sh
fi
# Checkpoints of the scaled-up runs are GBs: leave them behind (the device tool returns at most 16 MiB a file).
tar czf "$OUT/gpu-part-$PART.tgz" --exclude=checkpoints --exclude="*.pt" --exclude="*.dcp" -C "$RES" .
cat "$RES/steps.txt"
