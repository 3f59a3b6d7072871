"""ampkit.compare: the band, the hard rules, real FP32-vs-AMP runs (toy, planted harms, digits)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import ampkit
from ampkit.errors import UsageError
from ampkit.verify import band as cmp
from task_specs import TOY  # noqa: F401


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


def test_non_finite_amp_is_a_hard_failure_whatever_the_statistics():
    fp32 = {s: cmp.RunOutcome(curve=c, final=0.9, steps=40) for s, c in
            _curves({0: [2.0, 1.0, 0.5, 0.3], 1: [2.1, 1.1, 0.55, 0.32]}).items()}
    amp = {**fp32, 0: cmp.RunOutcome(curve=_curves({0: [2.0, None, None, None]})[0], final=0.9, steps=40)}
    assert cmp.hard_reasons(fp32, amp, "FP16", "accuracy") == ["FP16 loss became non-finite at step 20 (seed 0)"]
    inf = {**fp32, 1: cmp.RunOutcome(curve=fp32[1].curve, final=math.inf, steps=40)}
    assert cmp.hard_reasons(fp32, inf, "BF16", "accuracy") == ["final accuracy of BF16 is not finite (seed 1)"]


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
    assert r.seeds == (0, 1, 2) and r.steps == 40 and r.precision == "bf16"
    for side in ("fp32", "amp"):
        assert set(r.curves[side]) == {0, 1, 2}
        assert [p[0] for p in r.curves[side][0]] == r.band["steps"]
    # same initial weights and data: the first logged losses of FP32 and BF16 agree to BF16 rounding
    for s in (0, 1, 2):
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
                "curves", "band", "final_metric", "ratios", "scale_trace", "audit", "report", "margins", "effects"):
        assert key in data, key
    ends = data["effects"]["endpoints"]
    assert [e["name"].split(" (")[0] for e in ends] == ["final accuracy", "late training loss"]
    for e in ends:
        assert {"mean", "lower", "upper", "tolerance", "detectable", "decision", "per_seed", "n"} <= set(e)
        assert e["lower"] <= e["mean"] <= e["upper"] < e["tolerance"] and e["n"] == 3
    assert len(data["effects"]["windows"]) == 4 and data["margins"]["alpha"] == 0.05
    assert data["verdict"] == "pass"
    assert set(data["device"]) >= {"type", "name"} and data["device"]["type"] == "cpu"
    assert data["versions"]["torch"] == torch.__version__
    assert set(data["curves"]) == {"fp32", "amp"} and set(data["curves"]["fp32"]) == {"0", "1", "2"}
    assert set(data["ratios"]) >= {"speedup", "memory_saving"}  # keys are extended, never renamed
    assert data["final_metric"]["name"] == "accuracy" and len(data["final_metric"]["amp"]) == 3
    assert data["report"].endswith("report.html") and Path(data["report"]).exists()


def test_planted_fp16_overflow_fails_with_the_right_reasons(harmful_compare):
    r = harmful_compare
    assert r.verdict == "fail"
    text = "\n".join(r.reasons)
    assert "FP16 loss became non-finite at step 1 (seeds 0, 1)" in text
    assert "100% of FP16 steps skipped" in text
    assert "scale collapsed" in text and "fix:" in text
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
    assert r.verdict != "pass"  # one seed measures no paired spread: never a pass
    assert r.report is None


@pytest.mark.slow
def test_digits_bf16_passes_on_cpu(digits_compare):
    r = digits_compare
    assert r.verdict == "pass", r.reasons
    assert r.task == "digits" and r.device["type"] == "cpu"
    assert min(r.final_metric["amp"]) > 0.93
    assert r.audit["matmul_share"] == 1.0 and not r.audit["surprises"]
    assert math.isfinite(r.ratios["speedup"])


# ------------------------------------------------------------------ planted harms on real digits runs (issue 28)
PLANTED = str(Path(__file__).parent / "planted_task.py") + ":make_task"


@pytest.mark.parametrize("harm, expected", [("none", {"pass", "inconclusive"}), ("lr", {"fail"}),
                                            pytest.param("labels", {"fail"}, marks=pytest.mark.slow)])
def test_real_digits_planted_harm(harm, expected):
    """Three real FP32/BF16 run pairs of digits (small CNN, 100 steps): no harm never fails (it passed here, single
    thread), a halved learning rate and label noise in the AMP runs fail."""
    r = ampkit.compare(PLANTED, precision="bf16", seeds=3, steps=100, device="cpu", run_audit=False,
                       task_options={"harm": harm})
    assert r.verdict in expected, r.reasons
    ends = {e["name"].split(" (")[0]: e for e in r.effects["endpoints"]}
    if harm == "lr":  # the late loss is far beyond 1 %, with all three seeds
        assert ends["late training loss"]["lower"] > 0.01 and min(ends["late training loss"]["per_seed"]) > 0.01
    if harm == "none":
        assert all(abs(e["mean"]) < 0.01 for e in ends.values())


def test_fp8_recipe_and_layers_reach_every_run(monkeypatch):
    """`compare --fp8-layers eligible --fp8-recipe rowwise` trains every run with them (a spy on the real train)."""
    from ampkit.verify import runs as runs_mod
    from ampkit.verify.compare import compare

    seen = []
    real = runs_mod.train

    def spy(config, **kw):
        seen.append((config.fp8_recipe, config.fp8_layers))
        return real(config, **kw)

    monkeypatch.setattr(runs_mod, "train", spy)
    compare(TOY, precision="bf16", seeds=2, steps=4, run_audit=False, fp8_recipe="rowwise", fp8_layers="eligible")
    assert seen and set(seen) == {("rowwise", "eligible")}
