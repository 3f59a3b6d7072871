"""ampkit.compare: the band, the verdict rules, real FP32-vs-AMP runs (toy, planted harm, digits)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import ampkit
from ampkit.errors import UsageError
from ampkit.verify import band as cmp
from conftest import TOY  # noqa: F401  (tests/verify/conftest.py)


def _curves(values_by_seed):
    return {s: [[10 * (i + 1), v] for i, v in enumerate(vals)] for s, vals in values_by_seed.items()}


# ------------------------------------------------------------------ the band and the rules (no training)
def test_band_uses_range_estimator_and_relative_floor():
    b = cmp.band(_curves({0: [2.0, 1.0], 1: [2.2, 1.0], 2: [2.1, 1.0]}))
    assert b["steps"] == [10, 20]
    assert b["lo"][0] == 2.0 and b["hi"][0] == 2.2
    sigma = 0.2 / 1.693
    assert b["sigma"][0] == pytest.approx(sigma)
    assert b["upper"][0] == pytest.approx(2.2 + max(cmp.BAND_SIGMAS * sigma, cmp.BAND_REL * 2.1))
    # identical seeds: no spread, the relative floor alone
    assert b["upper"][1] == pytest.approx(1.0 * (1 + cmp.BAND_REL))


def test_curve_inside_band_passes_and_last_point_blip_is_ignored():
    b = cmp.band(_curves({0: [2.0, 1.0, 0.5, 0.3, 0.2], 1: [2.1, 1.1, 0.55, 0.32, 0.22]}))
    assert cmp.judge_curve(0, _curves({0: [2.05, 1.05, 0.52, 0.31, 0.21]})[0], b, "BF16") == (None, None)
    blip = _curves({0: [2.05, 1.05, 0.52, 0.31, 5.0]})[0]
    assert cmp.judge_curve(0, blip, b, "BF16") == (None, None)


def test_divergence_names_the_first_step_out_for_good():
    b = cmp.band(_curves({0: [2.0, 1.0, 0.5, 0.3, 0.2, 0.15], 1: [2.1, 1.1, 0.55, 0.32, 0.22, 0.16]}))
    amp = _curves({0: [2.05, 3.0, 0.5, 0.9, 1.2, 1.5]})[0]  # out at 20, back in at 30, out for good from 40
    reason, _ = cmp.judge_curve(1, amp, b, "FP16")
    assert reason.startswith("FP16 diverged at step 40 (seed 1)")


def test_non_finite_and_below_band():
    b = cmp.band(_curves({0: [2.0, 1.0, 0.5, 0.3], 1: [2.1, 1.1, 0.55, 0.32]}))
    reason, _ = cmp.judge_curve(0, _curves({0: [2.0, None, None, None]})[0], b, "FP16")
    assert reason == "FP16 loss became non-finite at step 20 (seed 0)"
    reason, warn = cmp.judge_curve(0, _curves({0: [2.0, 0.1, 0.05, 0.01]})[0], b, "BF16")
    assert reason is None and "below the FP32 band from step 20" in warn


def test_metric_margins():
    reason, info = cmp.judge_metric("accuracy", True, [0.97, 0.98], [0.962], "BF16")
    assert reason is None and info["allowed"][0] == pytest.approx(0.96)
    reason, _ = cmp.judge_metric("accuracy", True, [0.97, 0.98], [0.95], "BF16")
    assert reason.startswith("final accuracy lower by 0.025")
    reason, info = cmp.judge_metric("training loss", False, [1.0, 1.1], [1.12], "BF16")  # 2% of 1.05 = 0.021
    assert reason is None and info["allowed"][1] == pytest.approx(1.121)
    reason, _ = cmp.judge_metric("training loss", False, [1.0, 1.1], [1.2], "BF16")
    assert reason.startswith("final training loss higher by 0.15")


def test_merge_seeds():
    merged = cmp.merge_seeds(["FP16 loss became non-finite at step 1 (seed 0)",
                               "FP16 loss became non-finite at step 1 (seed 1)",
                               "FP16 loss became non-finite at step 3 (seed 2)"])
    assert merged == ["FP16 loss became non-finite at step 1 (seeds 0, 1)",
                      "FP16 loss became non-finite at step 3 (seed 2)"]


def test_fp32_is_not_a_comparison():
    with pytest.raises(UsageError, match="nothing to compare"):
        ampkit.compare(TOY, precision="fp32", seeds=1, steps=2)


# ------------------------------------------------------------------ real runs
def test_toy_bf16_passes_with_same_weights_and_data(toy_compare):
    r = toy_compare
    assert r.verdict == "pass", r.reasons
    assert r.passed and r.reasons == ()
    assert r.seeds == (0, 1) and r.steps == 40 and r.precision == "bf16"
    for side in ("fp32", "amp"):
        assert set(r.curves[side]) == {0, 1}
        assert [p[0] for p in r.curves[side][0]] == r.band["steps"]
    # same initial weights and data: the first logged losses of FP32 and BF16 agree to BF16 rounding
    for s in (0, 1):
        f, a = r.curves["fp32"][s][0][1], r.curves["amp"][s][0][1]
        assert a == pytest.approx(f, rel=0.05)
    assert r.ratios["memory_saving"] is None and r.memory["fp32"] is None  # CPU: not tracked, said so
    assert any("n/a on CPU" in n for n in r.notes)
    assert r.ratios["speedup"] > 0
    assert r.scale_trace is None  # BF16: no scaler
    assert r.audit["matmul_share"] == 1.0


def test_compare_json_has_the_contract_keys(toy_compare):
    folder = Path(toy_compare.report).parent
    data = json.loads((folder / "compare.json").read_text())
    for key in ("verdict", "reasons", "warnings", "task", "precision", "seeds", "steps", "device", "versions",
                "curves", "band", "final_metric", "ratios", "scale_trace", "audit", "report"):
        assert key in data, key
    assert data["verdict"] == "pass"
    assert set(data["device"]) >= {"type", "name"} and data["device"]["type"] == "cpu"
    assert data["versions"]["torch"] == torch.__version__
    assert set(data["curves"]) == {"fp32", "amp"} and set(data["curves"]["fp32"]) == {"0", "1"}
    assert set(data["ratios"]) >= {"speedup", "memory_saving"}  # keys are extended, never renamed
    assert data["final_metric"]["name"] == "accuracy" and len(data["final_metric"]["amp"]) == 2
    assert data["report"].endswith("report.html") and Path(data["report"]).exists()


def test_planted_fp16_overflow_fails_with_the_right_reasons(harmful_compare):
    r = harmful_compare
    assert r.verdict == "fail"
    text = "\n".join(r.reasons)
    assert "FP16 loss became non-finite at step 1 (seeds 0, 1)" in text
    assert "100% of FP16 steps skipped" in text
    assert "scale collapsed" in text and "fix:" in text
    assert "final accuracy lower by" in text
    assert any(w["code"] == "scale-collapse" and w["seeds"] == [0, 1] for w in r.warnings)
    # the scale trace is recorded for FP16 and shows the collapse to the floor
    assert set(r.scale_trace) == {0, 1}
    assert r.scale_trace[0][0][1] < 2.0**16 and min(p[1] for p in r.scale_trace[0]) == 1.0


def test_callable_factory_and_seed_list():
    import toy_task

    r = ampkit.compare(toy_task.make_task, precision="bf16", seeds=[3], steps=12, log_every=3, run_audit=False)
    assert r.seeds == (3,) and r.audit is None
    assert [p[0] for p in r.curves["amp"][3]] == [3, 6, 9, 12]
    assert any("one seed" in n for n in r.notes)
    assert r.report is None


@pytest.mark.slow
def test_digits_bf16_passes_on_cpu(digits_compare):
    r = digits_compare
    assert r.verdict == "pass", r.reasons
    assert r.task == "digits" and r.device["type"] == "cpu"
    assert min(r.final_metric["amp"]) > 0.93
    assert r.audit["matmul_share"] == 1.0 and not r.audit["surprises"]
    assert math.isfinite(r.ratios["speedup"])
