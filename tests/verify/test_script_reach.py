"""`ampkit compare` on multi-process scripts (real torchrun / accelerate launch, 2 gloo processes on the CPU) and
on pure-BF16 scripts (the FP32 reference keeps FP32 weights). Every run is a real launch of the real script;
these are slow on a 2-core machine (each launch starts 3 Python processes), hence `slow`. The fast tests of the
same mechanisms: tests/diagnose/test_script_launch.py and tests/diagnose/test_dtype_switch.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.verify.script_compare import compare_script
from ampkit.diagnose.script_launch import Launch, parse_launch

SCRIPTS = Path(__file__).parent / "scripts"
DDP = str(SCRIPTS / "ddp_loop.py")
PURE = str(SCRIPTS / "pure_bf16.py")


@pytest.mark.slow
def test_ddp_under_nproc_passes(tmp_path):
    code = main(["compare", "--json", "--no-audit", "--seeds", "3", "--nproc", "2", "--out", str(tmp_path), DDP,
                 "--steps", "12"])
    data = json.loads((tmp_path / "compare.json").read_text())
    assert code == 0 and data["verdict"] == "pass", data["reasons"]
    assert data["source"]["ranks"] == 2 and data["source"]["launch"].startswith("torchrun --standalone")
    assert data["steps"] == 12 and data["precision"] == "bf16"
    assert data["task_description"].startswith("torchrun --standalone --nproc-per-node 2 ")
    assert any("mean over the ranks" in n for n in data["notes"])
    assert (tmp_path / "runs" / "amp-seed0" / "run-rank1.json").exists()


@pytest.mark.slow
def test_fsdp2_through_torchrun_command_passes():
    launch, script, args = parse_launch(["torchrun", "--nproc-per-node", "2", DDP, "--strategy", "fsdp2",
                                         "--steps", "12"])
    result = compare_script(script, args, seeds=3, run_audit=False, launch=launch)
    assert result.verdict == "pass", result.reasons
    assert result.source["ranks"] == 2 and all(len(c) == 12 for c in result.curves["amp"].values())


@pytest.mark.slow
def test_ddp_fp16_overflow_fails():
    result = compare_script(DDP, ["--precision", "fp16", "--input-scale", "1e5", "--steps", "8"], seeds=2,
                            run_audit=False, launch=Launch.torchrun(2))
    assert result.verdict == "fail" and result.precision == "fp16"
    assert sum(result.skipped["amp"].values()) == 16 and sum(result.skipped["fp32"].values()) == 0


@pytest.mark.slow
@pytest.mark.parametrize("flag,expect", [("--die-rank", "rank 1 of 2 died without a record (launcher exit 1; root "
                                                        "cause: rank 1 exit code 3)"),
                                         ("--extra-step-rank", "the ranks disagree on the optimizer steps "
                                                               "(rank 0 took 4, rank 1 took 5)")])
def test_ranks_that_die_or_disagree_end_in_one_line(flag, expect, capsys, tmp_path):
    code = main(["compare", "--seeds", "1", "--no-audit", "--out", str(tmp_path), "--", "torchrun",
                 "--nproc-per-node", "2", DDP, "--steps", "4", flag, "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expect in err.splitlines()[-1] and "no verdict" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_accelerate_launch_passes():
    launch, script, args = parse_launch(["accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                                         "--mixed_precision", "bf16", str(SCRIPTS / "accelerate_loop.py")])
    result = compare_script(script, args, seeds=3, steps=8, run_audit=False, launch=launch)
    assert result.verdict == "pass", result.reasons
    assert result.source["ranks"] == 2 and result.precision == "bf16"


@pytest.mark.slow
def test_pure_bf16_lost_updates_fail(tmp_path):
    """lr * grad (~4e-4) is below half of BF16's rounding step at 1.0: the BF16 weights barely move."""
    result = compare_script(PURE, ["--lr", "1e-3"], seeds=3, run_audit=False)
    assert result.verdict == "fail", result.reasons
    assert result.precision == "bf16" and "pure low precision" in result.precision_reason
    assert any(k.startswith("Linear.to(bfloat16) at pure_bf16.py:") for k in result.source["switched"])
    assert any(k.startswith("Tensor.to(bfloat16) at pure_bf16.py:") for k in result.source["switched"])


@pytest.mark.slow
def test_pure_bf16_harm_below_tolerance_passes():
    result = compare_script(PURE, ["--lr", "0.05", "--noise", "2"], seeds=3, run_audit=False)
    assert result.verdict == "pass", result.reasons
    assert any(n.startswith("pure low precision: the FP32 runs kept FP32") for n in result.notes)


@pytest.mark.slow
def test_fabric_bf16_true_fp32_run_keeps_fp32(tmp_path):
    """Fabric "bf16-true" converts the module and the inputs itself: switched off in FP32, as written in AMP."""
    from ampkit.diagnose.script_run import run_script

    fp32 = run_script(str(SCRIPTS / "fabric_loop.py"), ["bf16-true"], mode="fp32", seed=0, folder=tmp_path / "f",
                      steps=3)
    amp = run_script(str(SCRIPTS / "fabric_loop.py"), ["bf16-true"], mode="amp", seed=0, folder=tmp_path / "a",
                     steps=3)
    assert fp32.steps == amp.steps == 3 and fp32.low_weights == [] and amp.low_weights == ["cpu:bfloat16"]
    assert any(k.startswith(("Sequential.to(bfloat16)", "torch.set_default_dtype(bfloat16)")) for k in fp32.switched)
    assert abs(fp32.losses[0] - amp.losses[0]) < 0.05 and fp32.losses[0] != amp.losses[0]


def test_pure_low_precision_is_the_amp_side_without_autocast():
    """Fast: a script with no autocast whose AMP runs converted the model is judged at that dtype; without either
    it is refused (nothing to compare)."""
    from ampkit.diagnose.script_run import ScriptRun
    from ampkit.errors import UsageError
    from ampkit.verify.script_compare import _amp_label

    def run(**kw):
        return ScriptRun(mode="amp", seed=0, steps=1, losses=[1.0], skipped=[None], scales=[None], stopped="finished",
                         autocast=[], scalers=0, scaler_enabled=False, stdout="", folder="", wall_s=1.0, cpu_s=1.0, **kw)

    assert _amp_label({0: run(low_weights=["cpu:bfloat16"])}, "s.py") == ("bf16", "cpu")
    assert _amp_label({0: run(low_weights=["cpu:float16"])}, "s.py") == ("fp16", "cpu")
    with pytest.raises(UsageError, match="enables no autocast region"):
        _amp_label({0: run()}, "s.py")


@pytest.mark.slow
def test_audit_run_under_torchrun(tmp_path):
    """The audit run of a launched comparison: every rank records its first step; rank 0's audit is kept."""
    from ampkit.diagnose.script_run import run_script
    from ampkit.verify.script_compare import AUDIT_ENTRY

    run = run_script(DDP, ["--steps", "3"], mode="amp", seed=0, folder=tmp_path, audit=True, entry=AUDIT_ENTRY,
                     launch=Launch.torchrun(2))
    assert run.steps == 1 and run.ranks == 2 and run.audit is not None
    assert sorted(p.name for p in tmp_path.glob("run-rank*.json")) == ["run-rank0.json", "run-rank1.json"]
