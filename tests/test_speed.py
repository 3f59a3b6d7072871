"""The speed ratio every renderer uses: paired, with its spread, 'within noise' when the spread covers 1.0."""

import doctest

import ampkit.training.speed as speed
from ampkit.training.speed import describe, speed_ratio


def test_pairs_median_spread_and_noise():
    r = speed_ratio([1233, 600, 409], [800, 790, 805])  # the per-seed samples/s, paired by seed
    assert r.pairs == (1233 / 800, 600 / 790, 409 / 805) and r.median == 600 / 790
    assert r.spread == (409 / 805, 1233 / 800) and r.within_noise is True
    assert r.text().endswith("over 3 seeds: within noise)")
    clear = speed_ratio([900, 950, 1000], [500, 510, 505])
    assert clear.within_noise is False and "noise" not in clear.text()


def test_one_pair_says_no_spread_was_measured():
    r = speed_ratio([900], [450])
    assert r.spread is None and r.within_noise is None and r.text() == "2.00x (one seed: no spread measured)"
    assert speed_ratio([2.0], [1.0], unit="round").text() == "2.00x (one round: no spread measured)"


def test_missing_or_bad_pairs_are_dropped_and_json_round_trips():
    r = speed_ratio([None, float("nan"), 0.0, 300.0], [100.0, 100.0, 100.0, 100.0])
    assert r.pairs == (3.0,)
    assert describe(speed_ratio([1.0, 3.0], [1.0, 1.0]).to_dict()) == "2.00x (1.00x-3.00x over 2 seeds: within noise)"
    assert describe(None, 1.5) == "1.50x (no spread measured)" and describe(None) == "n/a"


def test_module_examples_run():
    assert doctest.testmod(speed).failed == 0


def test_one_outlier_seed_does_not_stretch_the_spread():
    # Issue 45: "1.21x (1.14x-4.46x)": one seed caught by load made the spread 3x wider than the other seeds.
    r = speed_ratio([114, 119, 121, 131, 446], [100] * 5)
    lo, hi = r.spread
    assert r.median == 1.21 and 1.14 <= lo <= 1.21 <= hi <= 1.31
    assert r.text() == f"1.21x ({lo:.2f}x-{hi:.2f}x middle half of 5 seeds)" and r.within_noise is False
    assert r.to_dict()["range"] == [1.14, 4.46]  # the full range stays in the JSON


def test_rates_keep_significant_digits_never_0_or_1_from_rounding():
    # Issue 45: steps/s shown as "1 | 1" and "0", "matmul rate 0.0 TFLOP/s".
    from ampkit.training.speed import fmt_rate

    assert fmt_rate(1.37) == "1.37" and fmt_rate(0.6) == "0.6" and fmt_rate(0.0042) == "0.0042"
    assert fmt_rate(0.04123) == "0.0412" and fmt_rate(1234.5) == "1,234" and fmt_rate(0.00001234) == "0.0000123"
    assert fmt_rate(None) == "n/a" and fmt_rate(float("nan")) == "n/a"
