"""Compare SCRIPT's seeds, recording, verdict and audit, fast: the same code as ``ampkit compare SCRIPT``, with
each run's child (:func:`ampkit.diagnose.script_run.main`, the real switch, the real script) called in this
process instead of a fresh one (the slow tests in test_script_compare.py run the real subprocesses), and the
pieces (:class:`~ampkit.diagnose.switch.Switch`, the final metric) tested on their own."""

from __future__ import annotations

import contextlib
import io
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit.diagnose import script_run
from ampkit.diagnose.script_run import ScriptRun
from ampkit.diagnose.switch import Switch, run_seed
from ampkit.errors import UsageError
from ampkit.verify import script_compare
from ampkit.verify.script_compare import AUDIT_ENTRY, compare_script

SCRIPTS = Path(__file__).parent / "scripts"

TINY = """
import torch
from torch import nn
torch.manual_seed(42)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
for step in range(8):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"score {step + 1}.5")
"""


@pytest.fixture
def in_process(monkeypatch):
    """Each run's child in this process: ``python -m ENTRY SPEC`` becomes ``script_run.main([SPEC])``."""

    def run(argv, stdout, stderr, env=None, timeout=None, timeout_s=None):
        entry, spec = argv[2], argv[3]
        recorder = None
        if entry == AUDIT_ENTRY:
            from ampkit.verify.script_audit import FirstStepAudit

            recorder = FirstStepAudit()
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = script_run.main([spec], recorder=recorder)
        finally:
            sys.argv[:], sys.path[:] = saved_argv, saved_path
        stdout.write(out.getvalue().encode())
        stderr.write(err.getvalue().encode())
        return subprocess.CompletedProcess(argv, code)

    # Only the start of the child (`run_tied`, and `subprocess.run` where it is used) is replaced, in script_run's
    # view only.
    monkeypatch.setattr(script_run, "run_tied", run)
    monkeypatch.setattr(script_run, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "run": run}))


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def test_seed_k_gets_its_own_seeds_and_both_precisions_share_them(tiny, in_process, tmp_path):
    seen = []
    result = compare_script(tiny, seeds=3, log_every=1, out=tmp_path / "o", run_audit=True, metric=r"score ([0-9.]+)",
                            progress=lambda ev: seen.append((ev["seed"], ev["precision"]))
                            if ev["event"] == "run_start" else None)
    assert seen == [(s, p) for s in range(3) for p in ("amp", "fp32")]  # AMP first: refusals after one run
    first = {side: [curve[0][1] for curve in result.curves[side].values()] for side in ("fp32", "amp")}
    assert len(set(first["fp32"])) == 3  # another k, another start
    assert all(abs(a - b) <= 0.02 * abs(a) for a, b in zip(first["fp32"], first["amp"]))  # the same start per k
    assert result.precision == "bf16" and result.steps == 8
    assert result.verdict == "pass"  # BF16 on a linear fit: within the tolerance at 3 seeds
    assert result.final_metric["name"] == "score" and result.final_metric["higher_is_better"]
    assert set(result.final_metric["fp32"]) == {8.5}  # the last match, not the first (1.5)
    assert result.audit["matmul_share"] == 1.0  # the audit of the first AMP step: the matmul ran in BF16
    assert (tmp_path / "o" / "compare.json").is_file()


def test_an_fp16_overflow_script_fails(in_process):
    result = compare_script(str(SCRIPTS / "fp16_overflow.py"), seeds=2, steps=6, run_audit=False)
    assert result.verdict == "fail" and result.precision == "fp16"
    assert sum(result.skipped["amp"].values()) == 12 and sum(result.skipped["fp32"].values()) == 0
    assert result.scale_trace is not None


def test_run_seed_separates_k_and_values():
    assert run_seed(42, 0) != run_seed(42, 1) and run_seed(42, 0) != run_seed(43, 0)
    assert run_seed(42, 1) == run_seed(42, 1)


def _draws(mode: str, k: int) -> torch.Tensor:
    with Switch(mode=mode, seed=k):
        torch.manual_seed(42)  # the script's own seed
        return torch.rand(4)


def test_the_switch_seeds_run_k_alike_in_both_modes_and_apart_across_k():
    assert torch.equal(_draws("fp32", 0), _draws("amp", 0))
    assert not torch.equal(_draws("fp32", 0), _draws("fp32", 1))
    assert not torch.equal(_draws("amp", 1), _draws("amp", 2))


@pytest.mark.parametrize("mode, dtype, enabled", [("fp32", None, False), ("fp32", torch.float16, False),
                                                  ("amp", torch.float16, True)])
def test_the_switch_decides_the_scripts_grad_scaler(mode, dtype, enabled):
    with Switch(mode=mode, seed=0, dtype=dtype) as sw:
        scaler = torch.amp.GradScaler("cpu", enabled=True)
        also = torch.amp.GradScaler("cpu", enabled=False)
    assert scaler.is_enabled() is enabled and also.is_enabled() is enabled
    assert sw.scaler_enabled is enabled and sw.scalers == 2


def test_a_steps_loss_is_the_mean_of_its_own_backwards_only():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.ones(1, 2)
    with Switch(mode="fp32", seed=0) as sw:
        for values in ((1.0, 3.0), (10.0,), (5.0,)):  # step 1 accumulates two backwards
            for v in values:
                (model(x).sum() * 0 + v).backward()
            opt.step()
        got = sw.read()
    assert got["losses"] == [2.0, 10.0, 5.0] and sw.step == 3


def _run(losses, stdout="", stopped="finished"):
    return ScriptRun(mode="amp", seed=0, steps=len(losses), losses=losses, skipped=[0.0] * len(losses),
                     scales=[None] * len(losses), stopped=stopped, autocast=["cpu:bfloat16"], scalers=0,
                     scaler_enabled=False, stdout=stdout, folder="f", wall_s=1.0, cpu_s=1.0)


def test_the_final_metric_is_the_last_match():
    regex = script_compare._compile(r"acc ([0-9.]+)")
    assert script_compare._metric(_run([1.0], "acc 0.10\nacc 0.50\nacc 0.90\n"), regex, "acc") == 0.9
    with pytest.raises(UsageError, match="matched nothing"):
        script_compare._metric(_run([1.0], "loss 1\n"), regex, "acc")


def test_a_nan_final_loss_is_not_hidden_behind_the_last_finite_one():
    assert math.isnan(script_compare._metric(_run([2.0, 1.0, float("nan")]), None, ""))
    assert script_compare._metric(_run([2.0, 1.0, None]), None, "") == 1.0  # a step without a loss: the last one
    assert script_compare._metric(_run([2.0, 1.5]), None, "") == 1.5


@pytest.mark.parametrize("mode, forced, expect", [("fp32", None, torch.float32), ("amp", None, torch.bfloat16),
                                                  ("amp", torch.float16, torch.float16),
                                                  ("fp32", torch.float16, torch.float32)])
def test_the_switch_decides_the_scripts_autocast(mode, forced, expect):
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with Switch(mode=mode, seed=0, dtype=forced) as sw:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = a @ b
    assert out.dtype == expect
    assert sw.autocast_seen == (set() if expect == torch.float32 else {f"cpu:{str(expect)[6:]}"})
