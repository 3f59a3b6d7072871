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
