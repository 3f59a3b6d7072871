"""compare --explain (issue 20) on real CPU runs: the planted FP16 overflow inside a hand-written norm is found
and fixed, a rerun with the recommended flag passes, a clean task gets no recommendation, the budget holds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import ampkit
from ampkit.cli import main
from conftest import OVERFLOW_NORM, TOY


def test_overflowing_norm_is_ranked_first_and_named(overflow_explain):
    r = overflow_explain
    assert r.verdict == "fail"
    e = r.explain
    assert e["trigger"] == "fail" and e["steps_ranked"][0] == 0 and len(e["steps_ranked"]) == 2
    top = e["ranking"][0]
    assert top["module"] == "norm" and top["type"] == "HandNorm"
    assert top["fwd"] > 0.5 and all(m["added"] < 0.01 for m in e["ranking"][1:] if m["module"] in ("fc1", "fc2"))
    assert any(ev.startswith("overflow: pow") and "absorbed" in ev for ev in top["events"])


def test_recommendation_is_keep_norm_in_fp32(overflow_explain):
    rec = overflow_explain.explain["recommendation"]
    assert rec["kind"] == "fp32_modules" and rec["fp32_modules"] == ["norm"]
    assert rec["flags"] == "--fp32-modules norm"
    assert rec["compare_command"].startswith(f"ampkit compare --task {OVERFLOW_NORM} --precision fp16 --seeds 2 "
                                             "--steps 20") and rec["compare_command"].endswith("--fp32-modules norm")
    assert "fp32_modules=['norm']" in rec["python"]
    tried = overflow_explain.explain["candidates"]
    assert tried[0]["verdict"] == "pass" and tried[0]["fp32_modules"] == ["norm"] and tried[0]["speed_vs_amp"] > 0
    assert any(line.startswith("fix: keep `norm` in FP32") for line in overflow_explain.explain["summary"])


def test_explain_stays_within_its_default_budget(overflow_explain):
    e = overflow_explain.explain
    assert e["budget_s"] > 0 and e["wall_s"] <= e["budget_s"]


def test_explain_is_in_compare_json_and_the_report(overflow_explain):
    folder = Path(overflow_explain.report).parent
    data = json.loads((folder / "compare.json").read_text())
    assert data["explain"]["recommendation"]["flags"] == "--fp32-modules norm"
    page = (folder / "report.html").read_text()
    assert 'id="explain"' in page and 'id="img-modules"' in page and "--fp32-modules norm" in page
    assert (folder / "modules.png").read_bytes()[:4] == b"\x89PNG"


def test_rerun_with_the_recommended_flag_passes(overflow_explain, tmp_path, capsys):
    flags = shlex.split(overflow_explain.explain["recommendation"]["flags"])
    code = main(["compare", "--task", OVERFLOW_NORM, "--precision", "fp16", "--seeds", "2", "--steps", "20",
                 "--no-audit", "--out", str(tmp_path), *flags])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASS" in printed and "FP32 regions (norm): norm" in printed
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["fp32_modules"] == ["norm"] and data["regions"]["names"] == ["norm"]
    (cost,) = data["regions"]["per_region"]
    assert cost["spec"] == "norm" and cost["step_s_added"] is not None and cost["slowdown"] > 0


def test_clean_task_gets_no_recommendation():
    r = ampkit.compare(TOY, precision="bf16", seeds=2, steps=12, log_every=3, run_audit=False, explain=True)
    assert r.verdict == "pass"
    e = r.explain
    assert e["trigger"] == "requested" and e["candidates"] == [] and e["recommendation"] is None
    assert e["steps_ranked"] == [0] and {m["module"] for m in e["ranking"]} >= {"0", "3"}


def test_a_small_budget_is_kept_and_what_did_not_fit_is_said(capsys):
    code = main(["compare", "--task", OVERFLOW_NORM, "--precision", "fp16", "--seeds", "1", "--steps", "12",
                 "--no-audit", "--explain", "--explain-budget", "0.3x", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    e = data["explain"]
    assert e["wall_s"] <= e["budget_s"] and e["recommendation"] is None
    assert all(c["verdict"] == "not tried" for c in e["candidates"])
    assert any("explain budget" in n for n in e["notes"])


def _entry(name, added, events=(), step=0):
    return {"module": name, "type": "Linear", "fwd": added, "bwd": added, "added": added, "cumulative_fwd": None,
            "cumulative_bwd": None, "events": list(events), "step": step}


def test_standouts_use_the_median_of_modules_that_add_error():
    from ampkit.verify.explain import _standouts

    ranking = [_entry("head", 0.05), _entry("b.0.attn", 0.011), _entry("b.0.fc", 0.003), _entry("b.1.fc", 0.0031),
               _entry("b.0.fc.inner", 0.0), _entry("ln", 0.0), _entry("emb", 0.0), _entry("(Model)", 0.004)]
    # median of 0.05, 0.011, 0.003, 0.0031 is 0.00705: 3x that keeps head only; exact modules do not count
    assert _standouts(ranking, ()) == ["head"]
    flagged = ranking + [_entry("norm", 0.0, ["underflow: 5% of its non-zero FP32 outputs are 0 in FP16"])]
    assert _standouts(flagged, ()) == ["head", "norm"]
    assert _standouts(flagged, ("head",)) == ["norm"]  # already declared: not proposed again
    assert _standouts([_entry("(Model)", 1.0)], ()) == []  # the root is never a region


def test_rankings_of_two_steps_merge_per_module():
    from ampkit.verify.explain import _merge

    merged = _merge({0: [_entry("a", 0.5), _entry("b", 0.1), _entry("(M)", 0.0)],
                     20: [_entry("b", 0.9, ["overflow: x"], step=20), _entry("a", None, step=20)]})
    assert [m["module"] for m in merged] == ["a", "b", "(M)"]  # None (inf/NaN) ranks first, the root last
    assert merged[0]["added_by_step"] == {"0": 0.5, "20": None} and merged[0]["step"] == 20
    assert merged[1]["added"] == 0.9 and merged[1]["events"] == ["overflow: x"]
