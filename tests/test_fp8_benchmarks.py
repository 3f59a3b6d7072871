"""The FP8 result file (benchmarks/fp8_h200.py) renders into BENCHMARKS.md with its figures."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "h200-2026-12-01-fp8.json"


def _render_module():
    spec = importlib.util.spec_from_file_location("render_benchmarks_fp8", ROOT / "benchmarks" / "render_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fp8_result_records_what_the_issue_asks():
    d = json.loads(RESULT.read_text())
    assert d["card"] == "NVIDIA H200" and d["versions"]["torch"].startswith("2.11") and d["versions"]["torchao"]
    assert d["git_commit"] and d["date"].startswith("2026-12-01") and not d["skipped"]
    big = d["summary"]["gpt-d2048-l24"]
    # the bar of issue 14: FP8 tensorwise >= 1.06x BF16 tokens/s with lower peak memory
    assert big["fp8-tensorwise"]["speedup_vs_bf16"] >= 1.06 and big["fp8-tensorwise"]["peak_gib"] < big["bf16_peak_gib"]


def test_fp8_section_is_rendered_from_the_newest_file(tmp_path):
    rb = _render_module()
    shutil.copy(RESULT, tmp_path / RESULT.name)
    newer = json.loads(RESULT.read_text())
    newer["date"] = "2026-12-02T00:00:00Z"
    newer["summary"]["gpt-d2048-l24"]["fp8-tensorwise"]["speedup_vs_bf16"] = 1.5
    (tmp_path / "newer-fp8.json").write_text(json.dumps(newer))
    page = rb.render(rb.load_results(tmp_path))
    section = page.split("## FP8 training", 1)[1]
    assert "| fp8-tensorwise | 245.1 | 1.500 |" in section and "1.084" not in section
    assert "`newer-fp8.json`" in section and "torchao 0.18.0" in section
