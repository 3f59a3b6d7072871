"""What the compare report and summary say around the verdict: the failing bound visible, the test set's size,
a next step, one seed not called a spread, and the speed-up with its spread (never a bare figure)."""

from __future__ import annotations

import dataclasses

from ampkit.cli.compare import next_step
from ampkit.tasks import load_task
from ampkit.training.speed import speed_ratio
from ampkit.verify.report import _allowed_bound, _figure, render_html


def test_failing_side_of_the_final_metric_is_visible():
    fig = _figure()
    ax = fig.add_subplot()
    ax.scatter([0, 0, 1, 1], [0.97, 0.98, 0.975, 0.979])
    _allowed_bound(ax, [0.96, 0.99], higher_is_better=True)  # the range holds every seed
    lo, hi = ax.get_ylim()
    shaded = (0.96 - lo) / (hi - lo)
    assert lo < 0.96 < hi and 0.05 < shaded < 0.6  # neither off the axis nor filling it
    assert any("fails below 0.96" in t.get_text() for t in ax.get_legend().get_texts())


def test_one_seed_is_not_called_a_spread(toy_compare):
    # The paired judge never passes one seed (tests/verify/test_judge.py); a one-seed page claims no spread.
    one = dataclasses.replace(toy_compare, seeds=(0,))
    page = render_html(one, {"throughput.png": b""})
    assert "seed-to-seed spread" not in page and "within the FP32 spread" not in page
    assert "paired over 1 seeds" in page or "one seed" in page


def test_the_test_set_size_and_what_a_point_is(toy_compare):
    digits = load_task("digits", options={"size": "small"})
    r = dataclasses.replace(toy_compare, task_description=digits.description,
                            final_metric={**toy_compare.final_metric, "margin_text": "1 percentage point"})
    n = digits.extra["n_test"]
    page = render_html(r, {"throughput.png": b""})
    assert f"measured on {n:,} test images; 1 percentage point = {n / 100:g} images" in page


def test_a_next_step_after_pass_and_fail(toy_compare, harmful_compare):
    page = render_html(toy_compare, {"throughput.png": b""})
    assert 'id="next"' in page and 'ampkit.MixedPrecision("bf16")' in page
    assert "--precision bf16" in next_step(toy_compare)
    fail = render_html(harmful_compare, {"throughput.png": b""})
    assert "--explain</code> names the module" in fail


def test_speed_up_is_shown_with_its_spread(toy_compare):
    page = render_html(toy_compare, {"throughput.png": b""})
    info = toy_compare.ratios["speedup_spread"]
    assert info["unit"] == "seed" and len(info["pairs"]) == len(toy_compare.seeds) == 3
    assert "over 3 seeds" in page
    noisy = dataclasses.replace(toy_compare, ratios={**toy_compare.ratios,
                                                     "speedup_spread": speed_ratio([1233, 409], [800, 805]).to_dict()})
    assert "within noise" in render_html(noisy, {"throughput.png": b""})
