"""The simulated MUSA device (musa_device.py) is test infrastructure: these tests say it behaves like a card
where the ported-script tests rely on it, and fails where a card fails.

The backend rename cannot be undone inside a process, so every check runs in child processes: the
checks of _musa_device_checks.py in one child (one torch import), the runner in two more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import _musa_device_checks as checks_module

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "musa_device.py"


def child_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning")
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def check_results():
    proc = subprocess.run([sys.executable, str(HERE / "_musa_device_checks.py")], capture_output=True, text=True,
                          timeout=120, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(checks_module.CHECKS))
def test_simulated_musa_device(check_results, name):
    assert name in check_results, f"{name} did not run"
    assert check_results[name] is None, check_results[name]


TINY = """
import torch, torch.nn as nn
device = torch.device({device!r})
model = nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler(device.type, init_scale=1.0, enabled=device.type == "musa")  # no skipped step
for _ in range(3):
    with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "musa"):
        loss = model(torch.randn(8, 4, device=device)).float().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def run_tiny(tmp_path: Path, device: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / f"tiny_{device}.py"
    script.write_text(TINY.format(device=device))
    record = tmp_path / f"{device}.json"
    proc = subprocess.run([sys.executable, str(RUNNER), "--record", str(record), str(script)], capture_output=True,
                          text=True, timeout=120, env=child_env())
    return proc, json.loads(record.read_text())


def test_runner_records_a_musa_run(tmp_path):
    proc, rec = run_tiny(tmp_path, "musa")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec["steps"] == 3 and rec["param_devices"] == ["musa"] and rec["loss_devices"] == ["musa"]
    assert rec["losses_finite"] and len(rec["losses"]) == 3
    assert rec["scalers"] == [{"class": "torch.amp.grad_scaler.GradScaler", "device": "musa", "enabled": True}]
    assert {a["device_type"] for a in rec["autocast"]} == {"musa"} and rec["linear_dtypes"] == ["float16"]
    assert rec["error"] is None and rec["musa_memory_peak"] > 0


def test_runner_tells_a_cuda_script_apart(tmp_path):
    """The same script with device "cuda" fails on the simulated MUSA machine, and the record says why."""
    proc, rec = run_tiny(tmp_path, "cuda")
    assert proc.returncode == 1
    assert "Torch not compiled with CUDA enabled" in rec["error"], rec["error"]
    assert rec["steps"] == 0
