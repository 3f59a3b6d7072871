"""The verdict rules on constructed inputs: each hard reason fails a comparison on its own (issue 12 item 7), and the
paired test on the final metric and the late loss (issue 28)."""

from __future__ import annotations

import math

import pytest

from ampkit.verify import band as vb
from ampkit.verify.band import RunOutcome
from ampkit.verify.judge import judge

FP32_CURVES = {0: [2.0, 1.2, 0.8, 0.5, 0.4], 1: [2.1, 1.25, 0.82, 0.52, 0.41], 2: [2.05, 1.22, 0.79, 0.51, 0.405]}


def _curve(vals):
    return [[10 * (i + 1), v] for i, v in enumerate(vals)]


def _runs(finals, *, skipped=0, warnings=(), curves=FP32_CURVES, steps=50):
    return {s: RunOutcome(curve=_curve(curves[s]), final=finals[i], steps=steps, skipped=skipped,
                          warnings=tuple(warnings)) for i, s in enumerate(curves)}


def _judge(amp, fp32=None, **kw):
    fp32 = fp32 or _runs([0.95, 0.96, 0.955])
    return judge(label="FP16", fp32=fp32, amp=amp, metric="accuracy", higher_is_better=True, **kw)


def test_everything_inside_passes():
    v = _judge(_runs([0.952, 0.958, 0.95]))
    assert v.verdict == "pass" and v.reasons == () and v.passed
    assert v.exits == {0: None, 1: None, 2: None}
    ends = v.effects["endpoints"]
    assert [e["name"] for e in ends] == ["final accuracy", "late training loss (steps 50-50)"]
    assert all(e["decision"] == "pass" for e in ends) and ends[1]["mean"] == 0 and ends[1]["upper"] > 0


def test_final_metric_alone_fails():
    v = _judge(_runs([0.93, 0.935, 0.93]))  # curves identical to FP32; accuracy 2.4 % lower, tolerance 1 %
    assert v.verdict == "fail" and len(v.reasons) == 1
    assert v.reasons[0].startswith("final accuracy: FP16 worse by 2.442% (upper bound +2.935%, lower +1.717%)")
    assert v.reasons[0].endswith("beyond the tolerance")
    assert v.final_metric["effect"]["lower"] > 0.01


def test_final_metric_within_a_loose_tolerance_passes_and_a_straddle_is_inconclusive():
    assert _judge(_runs([0.93, 0.935, 0.93]), tolerance=0.05).verdict == "pass"
    v = _judge(_runs([0.946, 0.95, 0.946]))  # 0.8 % lower: neither surely within 1 % nor surely beyond
    assert v.verdict == "inconclusive" and "seeds would likely decide it" in v.reasons[0]


def test_skipped_share_alone_fails():
    v = _judge(_runs([0.952, 0.958, 0.95], skipped=3))  # 3 of 50 = 6% > 5%
    assert v.verdict == "fail" and len(v.reasons) == 1
    assert v.reasons[0].startswith("6% of FP16 steps skipped") and "seed 0: 3 of 50" in v.reasons[0]
    assert _judge(_runs([0.952, 0.958, 0.95], skipped=2)).verdict == "pass"  # 4%: allowed


def test_scale_collapse_alone_fails_with_the_bf16_advice():
    w = {"code": "scale-collapse", "step": 40, "message": "the FP16 loss scale fell to 1 (floor 1) by step 40",
         "fix": "lower the learning rate"}
    v = _judge(_runs([0.952, 0.958, 0.95], warnings=[w]), bf16_advice="use --precision bf16")
    assert v.verdict == "fail" and len(v.reasons) == 1
    assert v.reasons[0].startswith("scale collapsed (seeds 0, 1, 2)")
    assert "fix: use --precision bf16; or lower the learning rate" in v.reasons[0]
    assert [x["seeds"] for x in v.warnings] == [[0, 1, 2]]
    assert "bf16" not in _judge(_runs([0.952, 0.958, 0.95], warnings=[w])).reasons[0]
    # policy.bf16_advice without BF16 says "lower the learning rate": not repeated when the fix already says it
    same = _judge(_runs([0.952, 0.958, 0.95], warnings=[w]), bf16_advice="lower the learning rate")
    assert same.reasons[0].endswith("fix: lower the learning rate")


def test_non_finite_fp32_reference_alone_fails():
    bad = {**FP32_CURVES, 1: [2.1, None, 0.82, 0.52, 0.41]}
    fp32 = _runs([0.95, 0.96, 0.955], curves=bad)
    v = _judge(_runs([0.952, 0.958, 0.95]), fp32=fp32)
    assert v.verdict == "fail" and len(v.reasons) == 1
    assert v.reasons[0].startswith("the FP32 reference itself became non-finite at step 20 (seed 1)")
    assert v.band["upper"][1] is None  # that step has no band


def test_curve_alone_fails_and_first_exit():
    up = {s: [c[0], c[1], 1.5, 1.4, 1.3] for s, c in FP32_CURVES.items()}
    v = _judge(_runs([0.952, 0.958, 0.95], curves=up), fp32=_runs([0.95, 0.96, 0.955]))
    assert v.verdict == "fail" and len(v.reasons) == 1
    assert v.reasons[0].startswith("late training loss (steps 50-50): FP16 worse by")
    assert v.exits == {0: 30, 1: 30, 2: 30}  # worse from the window that starts at step 30 to the end


def test_worse_early_and_caught_up_is_a_warning_not_a_failure():
    early = {s: [c[0] * 1.5, c[1] * 1.5, c[2], c[3], c[4]] for s, c in FP32_CURVES.items()}
    v = _judge(_runs([0.952, 0.958, 0.95], curves=early))
    assert v.verdict == "pass" and [w["code"] for w in v.warnings] == ["worse-early"]


def test_seed_reasons_are_the_per_run_rules():
    b = vb.band({s: _curve(c) for s, c in FP32_CURVES.items()})
    ok = RunOutcome(curve=_curve([9.0, 9.0, 9.0, 9.0, 9.0]), final=0.0, steps=50)
    assert vb.seed_reasons(0, ok, "BF16") == []  # far above FP32, but the paired test needs every seed
    nan = RunOutcome(curve=_curve([2.0, None, None, None, None]), final=math.nan, steps=50, skipped=40)
    reasons = vb.seed_reasons(3, nan, "FP16")
    assert reasons[0] == "FP16 loss became non-finite at step 20 (seed 3)" and "80% of FP16 steps skipped" in reasons[1]
    assert b["hi"][0] == 2.1  # the band is still computed, for the plot


def test_one_seed_is_never_a_pass():
    one = {0: RunOutcome(curve=_curve(FP32_CURVES[0]), final=0.95, steps=50)}
    v = judge(label="BF16", fp32=one, amp=one, metric="accuracy", higher_is_better=True)
    assert v.verdict == "inconclusive" and any("one seed" in n for n in v.notes)
    assert "one seed measures no spread" in v.reasons[0]
