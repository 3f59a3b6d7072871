"""The FP8 result file (benchmarks/fp8_h200.py) records what issue 14 asks (its rendering into BENCHMARKS.md
is tested with every rounds file in tests/docs/test_benchmarks_md.py)."""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "h200-2026-12-01-fp8.json"


def test_fp8_result_records_what_the_issue_asks():
    d = json.loads(RESULT.read_text())
    assert d["card"] == "NVIDIA H200" and d["versions"]["torch"].startswith("2.11") and d["versions"]["torchao"]
    assert d["git_commit"] and d["date"].startswith("2026-12-01") and not d["skipped"]
    big = d["summary"]["gpt-d2048-l24"]
    # the bar of issue 14: FP8 tensorwise >= 1.06x BF16 tokens/s with lower peak memory
    assert big["fp8-tensorwise"]["speedup_vs_bf16"] >= 1.06 and big["fp8-tensorwise"]["peak_gib"] < big["bf16_peak_gib"]


def test_fp8_at_the_2b_shape_passes_compare():
    # issue 33: a PASS verdict at the largest Llama shape that trains on one H200, FP8 against FP32
    d = json.loads((ROOT / "benchmarks" / "results" / "h200-2026-12-02-fp8plan-compare-llama-8seeds.json").read_text())
    assert d["verdict"] == "pass" and d["seeds"] == list(range(8)) and d["git_commit"] and d["date"]
    assert d["precision"] == "fp8" and d["continuation"]["settings"]["fp8_layers"] == "eligible"
    assert "2.21B" in d["task_description"] and d["device"]["name"] == "NVIDIA H200"
    effect = d["final_metric"]["effect"]
    assert effect["n"] == 8 and effect["decision"] == "pass" and effect["upper"] < effect["tolerance"]
    assert d["memory"]["amp"] < d["memory"]["fp32"]


def _plan_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_plan_h200", ROOT / "benchmarks" / "fp8_plan_h200.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_part_continues_in_the_kept_folder(tmp_path, monkeypatch):
    # SEEDS replaces --seeds; KEEP holds --out across device calls, and a compare.json there adds --continue
    script = _plan_script()
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        folder = cmd[cmd.index("--out") + 1]
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(folder) / "compare.json").write_text(json.dumps({"seeds": len(calls)}))
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    monkeypatch.setenv("KEEP", str(tmp_path / "keep"))
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cache.json"))
    out = tmp_path / "out"
    out.mkdir()
    for seeds in ("5", "8"):
        monkeypatch.setenv("SEEDS", seeds)
        script.run_part("compare-llama", str(out), "h200-2026-12-02", lambda line: None)
    first, second = calls
    assert first[first.index("--seeds") + 1] == "5" and "--continue" not in first
    assert second[second.index("--seeds") + 1] == "8" and second[-1] == "--continue"
    assert first[first.index("--out") + 1] == str(tmp_path / "keep" / "fp8plan-compare-llama")
    assert json.loads((out / "h200-2026-12-02-fp8plan-compare-llama.json").read_text()) == {"seeds": 2}
