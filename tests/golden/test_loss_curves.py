"""Golden loss curves: the first 50 steps of the built-in tasks (small options) per precision on the CPU,
kept as text in this folder and compared within a tight tolerance.

A change that moves these numbers (the step, clipping, scaling, autocast, the tasks' data or init) fails
here; if the change is intended, regenerate and commit the files with

    UPDATE_GOLDEN=1 PYTHONPATH=src python -m pytest tests/golden

and say in the commit why the curves moved.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ampkit

HERE = Path(__file__).parent
STEPS = 50
TASKS = {  # small options: the six runs take a few seconds
    "digits": {"batch_size": 32, "hidden": 32},
    "charlm": {"batch_size": 8, "seq_len": 32, "d_model": 32, "n_layers": 1, "n_heads": 2, "corpus_bytes": 100_000},
}
# Per-step tolerance, relative to the loss. Skips and the fp16 loss scale must match exactly.
#
# fp32 and bf16: ~10x what a different reduction order moves the curves (measured on this suite's 2-core
# runner, 1 vs 2 threads, worst step of 50: fp32 1.2e-6, bf16 1.5e-4).
#
# fp16: derived from what FP16 on a CPU can promise, not from one machine. A CPU with native FP16 kernels
# (AVX512-FP16, AMX-FP16) and one that computes in FP32 and rounds the result are both correct, and each
# FP16 result may round the other way between them: up to one FP16 ulp, 2 * u with u = 2**-11 the unit
# roundoff. The loss depends most directly on two FP16 results of the forward (the last hidden activations
# and the logits, both from FP16 matmuls), so one step's loss may move by 2 * 2u = 4u = 2**-9 = 1.95e-3
# relative between two such CPUs. Measured: 2.5e-5 on this runner (1 vs 2 threads), 6e-4 on a CPU with
# AVX512-FP16/AMX (issue 26), both inside it.
#
# That bound holds for one step, not for 50: a rounding difference moves the weights, and the curves drift
# apart as training goes on (measured on an AVX512-FP16 CPU against curves recorded on an AVX512 one: digits
# FP16 5e-5 at step 10, 4.9e-3 at step 44). So the curves are computed with the CPU kernels pinned to one
# instruction set every x86-64 machine has (AVX2: oneDNN's, ATen's and MKL's, in a child process, since the
# pins are read at start-up); then every machine runs the same kernels, and the tolerances only absorb the
# thread count.
U_FP16 = 2.0**-11
RTOL = {"fp32": 1e-5, "bf16": 2e-3, "fp16": 4 * U_FP16}
PINNED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"}
PRECISIONS = ("fp32", "bf16", "fp16")


_CHILD = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import test_loss_curves as t
torch.set_num_threads(1)
curves = {f"{k}-{p}": t._curve(k, p) for k in t.TASKS for p in t.PRECISIONS}
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "curves": curves}))
"""


@pytest.fixture(scope="module")
def curves() -> dict[str, list[tuple[int, float, int, float]]]:
    """The six curves, computed once in a child process with the kernels pinned (``PINNED``) and one
    intra-op thread: the same reduction order on every machine whatever its core count or instruction set."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the golden curves are x86-64 numbers (AVX2 kernels); other CPUs round differently")
    done = subprocess.run([sys.executable, "-c", _CHILD, str(HERE)], env={**os.environ, **PINNED},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if data["capability"] != "AVX2":
        pytest.skip(f"this CPU cannot run the AVX2 kernels the golden curves were computed with "
                    f"({data['capability']})")
    return {k: [tuple(r) for r in v] for k, v in data["curves"].items()}


def _curve(task: str, precision: str) -> list[tuple[int, float, int, float]]:
    result = ampkit.train(ampkit.TrainConfig(task=task, task_options=TASKS[task], precision=precision, steps=STEPS,
                                             seed=0, log_every=1, evaluate=False, device="cpu"))
    return [(r["step"], r["loss"], r["skipped"], r["scale"]) for r in result.history]


def _write(path: Path, task: str, precision: str, rows: list[tuple[int, float, int, float]]) -> None:
    opts = " ".join(f"{k}={v}" for k, v in TASKS[task].items())
    lines = [f"# ampkit train --task {task} --precision {precision} --steps {STEPS} --seed 0 --log-every 1 (CPU)",
             f"# task options: {opts}",
             f"# torch {torch.__version__}, kernels pinned to AVX2 (oneDNN, ATen, MKL); regenerate: "
             "UPDATE_GOLDEN=1 python -m pytest tests/golden",
             "# step loss skipped scale"]
    lines += [f"{s} {loss!r} {skipped} {scale!r}" for s, loss, skipped, scale in rows]
    path.write_text("\n".join(lines) + "\n")


def _read(path: Path) -> list[tuple[int, float, int, float]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            s, loss, skipped, scale = line.split()
            rows.append((int(s), float(loss), int(skipped), float(scale)))
    return rows


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("task", sorted(TASKS))
def test_loss_curve_matches_golden(task, precision, curves):
    path = HERE / f"{task}-{precision}.txt"
    rows = curves[f"{task}-{precision}"]
    if os.environ.get("UPDATE_GOLDEN") == "1":
        _write(path, task, precision, rows)
        pytest.skip(f"regenerated {path.name}")
    assert path.is_file(), f"{path} is missing: run UPDATE_GOLDEN=1 python -m pytest tests/golden"
    golden = _read(path)
    assert [r[0] for r in rows] == [g[0] for g in golden] == list(range(1, STEPS + 1))
    for (step, loss, skipped, scale), (_, g_loss, g_skipped, g_scale) in zip(rows, golden):
        assert math.isclose(loss, g_loss, rel_tol=RTOL[precision]), \
            f"{task} {precision} step {step}: loss {loss!r}, golden {g_loss!r}"
        assert (skipped, scale) == (g_skipped, g_scale), f"{task} {precision} step {step}: skips or loss scale moved"
