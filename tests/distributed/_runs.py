"""Shared helpers for the distributed tests: real ``torchrun`` processes, one tiny charlm.

The model is charlm at d_model=32 (two blocks, so FSDP2 shards per block) on 100 kB of the standard
library, 16 sequences of 32 bytes per global batch: each of 2 ranks trains on 8 of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

TASK_ARGS = ["--task", "charlm", "--task-arg", "d_model=32", "--task-arg", "n_layers=2", "--task-arg", "n_heads=2",
             "--task-arg", "seq_len=32", "--task-arg", "corpus_bytes=100000", "--task-arg", "batch_size=16"]
TASK_OPTIONS = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 32, "corpus_bytes": 100000, "batch_size": 16}

# Stated tolerances, single process vs 2 ranks on the same global batch (relative, per logged loss).
# FP32: only the order of the gradient sums differs. BF16: FSDP2 also gathers the weights in BF16
# (embeddings and norms too, which autocast would keep in FP32), so the last bits differ more.
RTOL = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}

_HUSH = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FAULTS_")}
    e.update(_HUSH)
    e.update(extra)
    return e


def run(cmd: list[str], *, extra_env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout end that session (torchrun and its workers), then fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(**(extra_env or {})), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int, args: list[str], *, extra_env: dict[str, str] | None = None, max_restarts: int = 0,
             timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(max_restarts), "-m", "ampkit", "train", *args]
    return run(cmd, extra_env=extra_env, timeout=timeout)


def ampkit(args: list[str], *, extra_env: dict[str, str] | None = None, timeout: float = 240):
    return run([sys.executable, "-m", "ampkit", *args], extra_env=extra_env, timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def dumps(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]


def assert_losses_close(got: list[float], want: list[float], rtol: float) -> None:
    assert len(got) == len(want), (got, want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= rtol * abs(w), f"step {i + 1}: {g} vs single process {w} (rtol {rtol}); {got} vs {want}"
