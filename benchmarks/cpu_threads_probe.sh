# Recorded in benchmarks/cpu-threads-quiet-2core.json (2026-12-04, before Task.cpu_threads: OMP_NUM_THREADS set the
# threads; since then OMP_NUM_THREADS=1 is what ampkit does by default for digits on the CPU). Run on a many-core machine:
#   OUT=/tmp/out bash benchmarks/cpu_threads_probe.sh
# quiet 2-core proxy: the device machine's CPU, pinned to 2 cores, no GPU visible
export CUDA_VISIBLE_DEVICES="" PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 MPLBACKEND=Agg
cd $(mktemp -d)
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu.txt
python3 -c "import torch;print(torch.__version__, torch.get_num_threads())" >> $OUT/cpu.txt
run() { # label threads busy
  local busy_pids=""
  if [ "$3" = busy ]; then for c in 0 1; do taskset -c $c sh -c 'while :; do :; done' & busy_pids="$busy_pids $!"; done; fi
  /usr/bin/time -f "$1 threads=$2 load=$3 user=%U sys=%S wall=%e" -a -o $OUT/times.txt env OMP_NUM_THREADS=$2 taskset -c 0,1 python3 -m ampkit compare --out run-$1-$2-$3 > $OUT/log-$1-$2-$3.txt 2>&1
  [ -n "$busy_pids" ] && kill $busy_pids
}
for r in 1 2; do for t in 2 1; do run r$r $t quiet; done; done
for t in 2 1; do run r1 $t busy; done
cat $OUT/times.txt
