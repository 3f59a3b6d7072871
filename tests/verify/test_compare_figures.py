"""Figures that add up (issue 45): the compare summary shows each figure once, and every figure behind the verdict
(the final metric's means, the seeds left out of them) the same way in the terminal, compare.json and the report.

The results are built from the real judge (ampkit.verify.judge) over hand-made runs: the summary and the report
render what the judge returns, and the values are chosen to reach the cases (a metric that is the training loss,
a non-finite FP32 metric, a FAIL) without training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ampkit.cli.compare import _summary
from ampkit.verify.band import MARGINS, RunOutcome
from ampkit.verify.judge import judge
from ampkit.verify.report import render_html
from ampkit.verify.result import CompareResult

STEPS = list(range(1, 21))


def _run(final: float, shift: float = 0.0, seed: int = 0) -> RunOutcome:
    curve = [[float(t), 2.0 / t + 0.01 * seed + shift] for t in STEPS]
    return RunOutcome(curve=curve, final=final, steps=STEPS[-1])


def _result(fp32: dict[int, float | None], amp: dict[int, float], metric: str, higher: bool,
            amp_shift: float = 0.0) -> CompareResult:
    """A compare result from the judge over these final values (None: the training loss's last point)."""
    f = {s: _run(v, seed=s) for s, v in fp32.items()}
    f = {s: (_run(r.curve[-1][1], seed=s) if fp32[s] is None else r) for s, r in f.items()}
    a = {s: _run(v, amp_shift, seed=s) for s, v in amp.items()}
    a = {s: (_run(r.curve[-1][1], amp_shift, seed=s) if amp[s] is None else r) for s, r in a.items()}
    v = judge(label="BF16", fp32=f, amp=a, metric=metric, higher_is_better=higher)
    seeds = tuple(f)
    return CompareResult(
        verdict=v.verdict, reasons=v.reasons, warnings=v.warnings, notes=v.notes, task="script.py",
        task_description="python script.py", precision="bf16", precision_reason="the script's own autocast",
        seeds=seeds, steps=STEPS[-1], log_every=1, device={"type": "cpu", "name": "CPU", "str": "cpu"},
        versions={}, curves={"fp32": {s: r.curve for s, r in f.items()}, "amp": {s: r.curve for s, r in a.items()}},
        band=v.band, final_metric=v.final_metric, throughput={"fp32": 100.0, "amp": 120.0, "unit": "steps/s"},
        memory={"fp32": None, "amp": None}, ratios={"speedup": None, "memory_saving": None},
        skipped={"amp": {s: 0 for s in seeds}, "fp32": {s: 0 for s in seeds}}, scale_trace=None, audit=None,
        margins=dict(MARGINS), wall_s=1.0, effects=v.effects)


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    """Rows read whole: rich wraps at the terminal's width, which differs between a shell and an xdist worker."""
    monkeypatch.setenv("COLUMNS", "200")


def _printed(r: CompareResult, capsys) -> str:
    _summary(r)
    return capsys.readouterr().out


def _card(page: str) -> str:
    """The report's final-metric card, as text."""
    start = page.index('<div class="card">')
    return page[start:page.index("</div></div>", start)]


def test_a_script_judged_by_its_training_loss_shows_the_final_loss_once(capsys):
    r = _result({0: None, 1: None, 2: None}, {0: None, 1: None, 2: None}, "training loss", False)
    table = _printed(r, capsys).split("paired by seed")[0]  # the summary table, before the paired tests' table
    assert table.count("final training loss") == 2  # the (mean) row and the (seeds) row; no third, bare copy
    assert "final training loss (mean)" in table and "final training loss (seeds)" in table
    # with a metric of its own, the training loss is a row of its own
    other = _result({0: 0.9, 1: 0.91, 2: 0.92}, {0: 0.9, 1: 0.91, 2: 0.92}, "score", True)
    assert _printed(other, capsys).split("paired by seed")[0].count("final training loss") == 1


def test_a_non_finite_fp32_metric_is_said_and_the_mean_of_the_rest_shown(capsys, tmp_path):
    r = _result({0: 0.50137, 1: math.nan, 2: 0.52063}, {0: 0.50137, 1: 0.51291, 2: 0.52063}, "score", True)
    m = r.final_metric
    assert math.isclose(m["fp32_mean"], 0.511) and m["fp32_not_finite"] == [1] and m["amp_not_finite"] == []
    assert any("FP32's is not finite (seed 1)" in n for n in r.notes)  # not dropped in silence
    text = _printed(r, capsys)
    row = next(ln for ln in text.splitlines() if "final score (mean)" in ln)
    assert "51.10% (seed 1 not finite)" in row and "n/a" not in row and "nan" not in row
    seeds_row = next(ln for ln in text.splitlines() if "final score (seeds)" in ln)
    assert "50.14%..52.06% (+1 not finite)" in seeds_row
    card = _card(render_html(r, {"throughput.png": b""}))
    assert "FP32 51.10% (seed 1 not finite)" in card and "n/a" not in card
    data = json.loads(json.dumps(r.to_dict()))
    assert math.isclose(data["final_metric"]["fp32_mean"], 0.511) and data["final_metric"]["fp32_not_finite"] == [1]


def test_every_figure_of_a_failing_metric_is_shown_the_same_way(capsys):
    # AMP's score about 20 % below FP32's in every seed (values that are no counts): the final score fails
    r = _result({0: 0.50137, 1: 0.51291, 2: 0.52063}, {0: 0.40213, 1: 0.41377, 2: 0.41911}, "score", True)
    assert r.verdict == "fail" and any(x.startswith("final score: BF16 worse by") for x in r.reasons)
    m = r.final_metric
    assert math.isclose(m["fp32_mean"], 0.5116367, rel_tol=1e-6) and math.isclose(m["amp_mean"], 0.41167, rel_tol=1e-6) and m["allowed"]
    text = _printed(r, capsys)
    row = next(ln for ln in text.splitlines() if "final score (mean)" in ln)
    # the same figures, written the same way, in the terminal and the report (a rate: percentages in both)
    assert "51.16%" in row and "41.17%" in row and f"allowed >= {m['allowed'][0]:.2%}" in row and "n/a" not in row
    card = _card(render_html(r, {"throughput.png": b""}))
    assert "41.17%" in card and f"FP32 51.16%; allowed &gt;= {m['allowed'][0]:.2%}" in card  # the bound it failed


def test_a_non_finite_amp_metric_fails_and_is_named_in_every_view(capsys):
    r = _result({0: 0.50137, 1: 0.51291, 2: 0.52063}, {0: 0.50137, 1: math.nan, 2: math.nan}, "score", True)
    assert r.verdict == "fail" and any("not finite (seeds 1, 2)" in x for x in r.reasons)
    row = next(ln for ln in _printed(r, capsys).splitlines() if "final score (mean)" in ln)
    assert "51.16%" in row and "50.14% (seeds 1, 2 not finite)" in row
    assert "50.14% (seeds 1, 2 not finite)" in _card(render_html(r, {"throughput.png": b""}))


def test_a_failing_scripts_next_step_is_a_command_that_runs(capsys):
    # compare SCRIPT refuses --explain (tests/verify/test_cli.py): the advice after its FAIL is diagnose, in both views
    from dataclasses import replace

    from ampkit.cli import main

    r = replace(_result({0: 0.50137, 1: 0.51291, 2: 0.52063}, {0: 0.40213, 1: 0.41377, 2: 0.41911}, "score", True),
                source={"kind": "script", "script": "train.py", "args": ["--epochs", "2"]})
    text = _printed(r, capsys)
    assert "next: ampkit diagnose train.py --epochs 2 runs your script" in text and "--explain" not in text
    page = render_html(r, {"throughput.png": b""})
    assert "<code>ampkit diagnose train.py --epochs 2</code>" in page and "--explain</code>" not in page
    script = str(Path(__file__).parent / "scripts" / "plain_loop.py")
    assert main(["compare", "--explain", script]) == 2  # what the old advice ("add --explain") led to
    assert "--explain is for tasks" in capsys.readouterr().err
