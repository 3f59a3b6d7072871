"""Per-step overhead of ``ampkit diagnose`` on small models: the same training script run plainly and
under diagnose in this interpreter, interleaved, repeated; the ratio of median step times, as CPU time of
the training thread (``time.thread_time``: what a loaded shared machine distorts least) and as wall time.

    PYTHONPATH=src python benchmarks/diagnose_overhead.py [--repeats 5] [--steps 60] [--out FILE]

Each workload is a script (written to a temp folder) that takes ``--steps`` optimizer steps after 5
warm-up steps and reports its mean step time through a module-level list; JSON to stdout (and FILE)
with the median and spread per workload, the git commit, torch version and CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HEADER = '''
import sys, time
import torch
import torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads({threads})
steps = int(sys.argv[1])
'''

LOOP = '''
times = []
for step in range(steps + 5):
    t0, c0 = time.perf_counter(), time.thread_time()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype={dtype}, enabled={amp}):
        loss = loss_fn(model(x), y)
    {backward}
    if step >= 5:
        times.append((time.perf_counter() - t0, time.thread_time() - c0))
import ampkit_bench_sink
ampkit_bench_sink.times.append(tuple(sum(t[i] for t in times) / len(times) for i in (0, 1)))
'''

MLP = '''
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
loss_fn = lambda out, y: nn.functional.cross_entropy(out.float(), y)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
'''

TRANSFORMER = '''
class Block(nn.Module):
    def __init__(self, d=128, h=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
class LM(nn.Module):
    def __init__(self, v=256, d=128, n=2):
        super().__init__()
        self.emb = nn.Embedding(v, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, v)
    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)
model = LM()
x = torch.randint(0, 256, (8, 64)); y = torch.randint(0, 256, (8, 64))
loss_fn = lambda out, y: nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
'''

SCALER = "scaler = torch.amp.GradScaler('cpu')\n"
PLAIN_BACKWARD = "loss.backward(); opt.step()"
SCALED_BACKWARD = "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"

WORKLOADS = {
    "mlp-fp32": (MLP, "torch.float32", False, PLAIN_BACKWARD),
    "mlp-fp16-scaler": (MLP + SCALER, "torch.float16", True, SCALED_BACKWARD),
    "mlp-bf16": (MLP, "torch.bfloat16", True, PLAIN_BACKWARD),
    "transformer-fp32": (TRANSFORMER, "torch.float32", False, PLAIN_BACKWARD),
    "transformer-bf16": (TRANSFORMER, "torch.bfloat16", True, PLAIN_BACKWARD),
}


def _write(folder: str, name: str, threads: int) -> str:
    body, dtype, amp, backward = WORKLOADS[name]
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as fh:
        fh.write(HEADER.format(threads=threads) + body + LOOP.format(dtype=dtype, amp=amp, backward=backward))
    return path


def _plain(path: str, steps: int) -> tuple[float, float]:
    import ampkit_bench_sink

    saved = sys.argv[:]
    sys.argv = [path, str(steps)]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = saved
    return ampkit_bench_sink.times.pop()


def _diagnosed(path: str, steps: int) -> tuple[float, float]:
    import ampkit_bench_sink
    from ampkit.diagnose import diagnose_script

    result = diagnose_script(path, [str(steps)], steps=steps + 10)
    assert result.findings == (), result.findings
    return ampkit_bench_sink.times.pop()


def _load() -> list[float] | None:
    """The 1/5/15-minute load average: on a shared machine, how busy it was while measuring."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="workload names")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_before = _load()
    folder = tempfile.mkdtemp(prefix="ampkit-bench-")
    with open(os.path.join(folder, "ampkit_bench_sink.py"), "w") as fh:
        fh.write("times = []\n")
    sys.path.insert(0, folder)
    results = {}
    for name in args.only or WORKLOADS:
        path = _write(folder, name, args.threads)
        plain, diag = [], []
        for _ in range(args.repeats):  # interleaved: drift hits both alike
            plain.append(_plain(path, args.steps))
            diag.append(_diagnosed(path, args.steps))
        results[name] = {}
        for i, kind in ((1, "cpu"), (0, "wall")):  # CPU time of the training thread first: a loaded machine
            p, d = [t[i] for t in plain], [t[i] for t in diag]  # inflates wall time far more than CPU time
            ratios = [b / a for b, a in zip(d, p)]
            results[name].update({
                f"{kind}_plain_ms": round(statistics.median(p) * 1e3, 3),
                f"{kind}_diagnose_ms": round(statistics.median(d) * 1e3, 3),
                f"{kind}_ratio_median": round(statistics.median(ratios), 3),
                f"{kind}_ratio_min": round(min(ratios), 3),
                f"{kind}_ratio_max": round(max(ratios), 3),
            })
        print(name, results[name], file=sys.stderr)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = None
    payload = {"benchmark": "diagnose per-step overhead (CPU)", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "git_commit": commit, "torch": torch.__version__, "python": platform.python_version(),
               "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "threads": args.threads, "steps": args.steps,
               "repeats": args.repeats, "load_average_before": load_before, "load_average_after": _load(),
               "workloads": results}
    text = json.dumps(payload, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
