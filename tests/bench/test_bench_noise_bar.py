"""The engine-overhead bar on a noisy machine (issue 45): rounds whose spread covers the difference from the
hand-written loop say "within noise" with the spread, neither miss nor pass; an overhead beyond the spread is still
a miss. Round times are injected (bench.core's own combine and ratio steps), nothing is timed."""

from __future__ import annotations

import json

import pytest

from ampkit.bench.core import _ratios, combine_rounds
from ampkit.bench.report import evaluate_bars
from ampkit.cli.bench import render


def _round(runner: str, ms: float) -> dict:
    return {"precision": "bf16", "compiled": False, "runner": runner, "status": "ok", "ms_per_step": ms,
            "tokens_per_s": None, "samples_per_s": 100.0 / ms, "mfu": None, "peak_mem_bytes": None,
            "host_syncs_per_step": None, "loss_last": 2.0, "ratio_to_plain": None}


def _result(plain_ms: list[float], amp_ms: list[float]) -> dict:
    rows = [combine_rounds([_round("plain", t) for t in plain_ms]),
            combine_rounds([_round("ampkit", t) for t in amp_ms])]
    _ratios(rows)
    result = {"rows": rows, "model": {"name": "digits", "description": "digits MLP", "tokens_per_step": None},
              "device": {"name": "CPU", "type": "cpu"}, "versions": {"torch": "x"}, "peak": {"tflops": 0.05,
              "dtype": "float32"}, "settings": {"steps": 5, "warmup": 2, "rounds": len(plain_ms)}, "notes": []}
    result["bars"] = evaluate_bars(result)
    return result


def _overhead(result: dict) -> dict:
    return next(b for b in result["bars"] if b["name"] == "engine overhead bf16 eager")


def _bars_table(result: dict, capsys) -> str:
    render(result)
    return capsys.readouterr().out.split("bars")[-1]


def test_noisy_rounds_are_within_noise_not_a_miss(capsys):
    # A shared CPU: the paired ratios are 0.5, 2.384 and 4.0, a median of 2.384 that the spread covers
    r = _result([10.0, 10.0, 10.0], [5.0, 23.84, 40.0])
    bar = _overhead(r)
    assert bar["value"] == pytest.approx(2.384)
    assert bar["state"] == "within noise" and bar["pass"] is None and bar["spread"] == pytest.approx([0.5, 4.0])
    table = _bars_table(r, capsys)
    assert "within noise (0.500-4.000)" in table and "miss" not in table and "pass" not in table
    assert json.loads(json.dumps(r))["bars"][0]["state"] == "within noise"


def test_an_overhead_beyond_the_spread_is_still_a_miss(capsys):
    # 2.384x in every round, give or take 1 %: a real overhead, far beyond the spread
    r = _result([10.0, 20.0, 15.0], [23.6, 47.68, 36.1])
    bar = _overhead(r)
    assert bar["state"] == "miss" and bar["pass"] is False and bar["value"] == pytest.approx(2.384)
    table = _bars_table(r, capsys)
    assert "miss" in table and "within noise" not in table


def test_a_small_overhead_beyond_the_spread_passes():
    bar = _overhead(_result([10.0, 20.0, 15.0], [10.05, 20.1, 15.08]))
    assert bar["state"] == "pass" and bar["pass"] is True
