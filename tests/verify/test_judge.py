"""The paired verdict (ampkit.verify.judge, ampkit.verify.stats): its statistics, and its calibration on simulated
seeds whose noise is the one measured on real digits runs, with planted harms of known size.

Measured on digits (BF16 CPU autocast, 300 steps, 5 seeds, `ampkit compare` as shipped): the FP32 seeds' final
accuracy spreads with sd 0.56 points and their late training loss with sd ~30 %; the AMP-minus-FP32 difference of
one seed is 0 to 2 test images of 359 (sd 0.9 image) in accuracy and about 2 % (raw; 0.4 % against the loss scale
floor) in the late loss, growing over the run. The simulation below uses those figures.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampkit.verify import stats
from ampkit.verify.band import RunOutcome
from ampkit.verify.judge import TOLERANCE, infer_count, judge, tolerances

N_TEST = 359
STEPS = [10 * (i + 1) for i in range(40)]
FP32_ACC, FP32_ACC_SD = 0.971, 0.0056
SEED_LOSS_SD = 0.30  # FP32 seed-to-seed, relative, late in the run
PAIR_LOSS_SD = 0.02  # AMP minus FP32 within a seed, relative, at the end of the run (0 at the start)
PAIR_IMAGES_SD = 0.9
# charlm (d_model 32, 1 layer, 200 steps, 6 seeds; benchmarks/results/cpu-verdict-calibration.json): the FP32 seeds'
# validation loss spreads by about 2 %, the paired AMP-minus-FP32 difference by 0.44 %
LM_SEED_SD, LM_PAIR_SD = 0.02, 0.005


def _loss(t: float, shape: str) -> float:
    if shape == "lm":  # a byte-level LM: from ln(256) down to about 1.5 nats
        return 4.0 * math.exp(-t / 60.0) + 1.5
    return 2.3 * math.exp(-t / 40.0) + 0.04  # digits: trained to near-zero training loss


def _seed(rng: random.Random, *, harm: str = "none", size: float = 0.0, shape: str = "digits", relabel: bool = False
          ) -> tuple[RunOutcome, RunOutcome]:
    """One seed's FP32 and AMP runs. ``harm``: none, bias (loss x (1 + size)), lr (the AMP curve is the FP32 curve
    at ``size`` of the steps: a learning rate scaled by ``size``), round (loss + size by the end, accuracy -1 image),
    labels (accuracy - size, loss + 3 size). ``shape="lm"``: the final metric is the validation loss."""
    z, w = rng.gauss(0, 1), rng.gauss(0, 1)
    seed_sd, pair_sd = (LM_SEED_SD, LM_PAIR_SD) if shape == "lm" else (SEED_LOSS_SD, PAIR_LOSS_SD)
    scale = max(0.2, 1 + seed_sd * z)
    batch = [1 + 0.05 * rng.gauss(0, 1) for _ in STEPS]  # the same batches in both precisions
    f_curve = [_loss(t, shape) * scale * b for t, b in zip(STEPS, batch)]
    a_curve = []
    for i, (t, b) in enumerate(zip(STEPS, batch)):
        base = _loss(t * size, shape) * scale * b if harm == "lr" else f_curve[i]
        noise = pair_sd * (t / STEPS[-1]) * w + 0.001 * rng.gauss(0, 1)
        bias = {"bias": size, "round": size * t / STEPS[-1], "labels": 3 * size}.get(harm, 0.0)
        a_curve.append(base * (1 + noise + bias))
    if shape == "lm":
        f_final = statistics.fmean(f_curve[-4:]) / statistics.fmean(batch[-4:])
        a_final = statistics.fmean(a_curve[-4:]) / statistics.fmean(batch[-4:])
    else:
        f_images = round(N_TEST * min(1.0, FP32_ACC + FP32_ACC_SD * rng.gauss(0, 1)))
        lost = {"labels": size * N_TEST, "round": 1, "lr": 2}.get(harm, 0)
        f_final = f_images / N_TEST
        a_final = min(N_TEST, round(f_images + PAIR_IMAGES_SD * rng.gauss(0, 1) - lost)) / N_TEST
    fp32 = RunOutcome(curve=[[s, v] for s, v in zip(STEPS, f_curve)], final=f_final, steps=400)
    amp = RunOutcome(curve=[[s, v] for s, v in zip(STEPS, a_curve)], final=a_final, steps=400)
    return fp32, amp


def _verdict(rng: random.Random, n: int, **harm) -> str:
    relabel = harm.pop("relabel", False)
    pairs = [_seed(rng, **harm) for _ in range(n + (1 if relabel else 0))]
    fp32 = {k: p[0] for k, p in enumerate(pairs[:n])}
    # no harm, relabelled: the FP32 run of another seed plays the AMP run (the pairing is lost)
    amp = {k: pairs[k + 1][0] for k in range(n)} if relabel else {k: p[1] for k, p in enumerate(pairs[:n])}
    lm = harm.get("shape") == "lm"
    return judge(label="BF16", fp32=fp32, amp=amp, metric="val loss" if lm else "accuracy",
                 higher_is_better=not lm, metric_count=None if lm else N_TEST).verdict


def _rates(n: int, reps: int, seed: int = 0, **harm) -> dict[str, float]:
    rng = random.Random(seed * 1000 + n)
    out = [_verdict(rng, n, **dict(harm)) for _ in range(reps)]
    return {v: out.count(v) / reps for v in ("pass", "fail", "inconclusive")}


# ---------------------------------------------------------------------------------------- statistics
def test_t_quantile_matches_scipy():
    from scipy import stats as sp

    for df in (1, 2, 3, 4, 7, 9, 30, 200):
        for p in (0.6, 0.8, 0.95, 0.975, 0.9875, 0.999):
            assert stats.t_quantile(p, df) == pytest.approx(sp.t.ppf(p, df), rel=1e-8)
            assert stats.t_quantile(1 - p, df) == pytest.approx(sp.t.ppf(1 - p, df), rel=1e-8)


@settings(max_examples=200, deadline=None)
@given(sd=st.floats(1e-6, 10.0), n=st.integers(2, 60), alpha=st.sampled_from([0.05, 0.025, 0.0125]))
def test_more_seeds_never_widen_the_interval(sd, n, alpha):
    assert stats.half_width(sd, n + 1, alpha) < stats.half_width(sd, n, alpha)
    assert stats.detectable(sd, n + 1, alpha) < stats.detectable(sd, n, alpha)
    # the same through paired_effect: harms with exactly that mean and sd, n and n + 1 of them
    base = [(-1) ** k for k in range(n)], [(-1) ** k for k in range(n + 1)]
    widths = []
    for b in base:
        m, s = statistics.fmean(b), statistics.stdev(b)
        harms = [0.001 + sd * (x - m) / s for x in b]
        e = stats.paired_effect(harms, tolerance=1.0, floor=0.0, alpha_pass=alpha, alpha_fail=alpha)
        widths.append(e.upper - e.lower)
    assert widths[1] < widths[0] * (1 + 1e-9)


def test_identical_runs_are_not_a_zero_width_interval():
    e = stats.paired_effect([0.0, 0.0, 0.0], tolerance=0.01, floor=1e-4)
    assert e.sd == 0 and e.sd_used == 1e-4 and e.upper > 0 and e.decision == "pass"
    # two seeds of identical accuracy: the counting floor leaves the interval wider than one counting error
    one = 1 / 359
    two = stats.paired_effect([0.0, 0.0], tolerance=one, floor=one / math.sqrt(6))
    assert two.decision == "inconclusive" and two.upper > one


def test_one_seed_never_passes_and_fails_only_far_beyond_the_tolerance():
    assert stats.paired_effect([0.0], tolerance=0.01, floor=1e-4).decision == "inconclusive"
    assert stats.paired_effect([0.025], tolerance=0.01, floor=1e-4).decision == "inconclusive"
    e = stats.paired_effect([0.05], tolerance=0.01, floor=1e-4, alpha_fail=0.025)
    assert e.decision == "fail" and e.lower == pytest.approx(0.05 - 1.959964 * 0.01, rel=1e-5)


def test_inconclusive_says_how_many_seeds_would_decide():
    e = stats.paired_effect([0.002, 0.009, -0.001], tolerance=0.01, floor=1e-4)
    assert e.decision == "inconclusive" and e.seeds_to_decide is not None and e.seeds_to_decide > 3
    n, gap = e.seeds_to_decide, 0.01 - e.mean  # the fewest seeds that resolve the gap with 80 % power
    assert stats.detectable(e.sd_used, n) < gap <= stats.detectable(e.sd_used, n - 1)
    assert e.mean + stats.half_width(e.sd, n) < 0.01  # at that many seeds, the observed mean and sd would pass


def test_tolerances_per_kind_and_counting():
    assert infer_count([351 / 359, 347 / 359, 350 / 359]) == 359
    assert infer_count([0.9, math.pi / 4]) is None or infer_count([0.9, math.pi / 4]) > 1000
    assert tolerances("auc", [0.9, math.pi / 4], [0.9, 0.8], None, None)[0] == TOLERANCE  # not a count: 1 %
    tol, floor, how = tolerances("accuracy", [0.97, 0.96], [0.97, 0.95], None, 359)
    assert tol == TOLERANCE and floor == pytest.approx(1 / (359 * 0.965) / math.sqrt(6)) and "359" in how
    tol, _, how = tolerances("accuracy", [0.9, 0.92], [0.9, 0.9], None, 50)  # never raised to a counting error
    assert tol == TOLERANCE and "50 test examples" in how
    assert tolerances("val loss", [1.2, 1.3], [1.2, 1.3], None, None)[0] == TOLERANCE
    assert tolerances("val loss", [1.2, 1.3], [1.2, 1.3], 0.05, None)[0] == 0.05


# ---------------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("n", [2, 3, 5, 10])
@pytest.mark.parametrize("shape", ["digits", "lm"])
def test_no_harm_fails_at_most_5_percent(n, shape):
    for relabel in (False, True):
        r = _rates(n, 150, shape=shape, relabel=relabel)
        assert r["fail"] <= 0.05, (n, relabel, r)
    if n >= 3:  # paired, no harm: mostly a pass (3 seeds: 0.77 for the LM's spread, 1.0 from 5 seeds on)
        assert _rates(n, 150, seed=1, shape=shape)["pass"] >= (0.7 if n == 3 else 0.95)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_at_the_tolerance_neither_pass_nor_fail_beyond_alpha(n):
    """The size of the equivalence test where it is tightest: a true harm equal to the tolerance."""
    rng = random.Random(n)
    sd, tol, reps = 0.004, 0.01, 4000
    decisions = [stats.paired_effect([rng.gauss(tol, sd) for _ in range(n)], tolerance=tol, floor=1e-4,
                                     alpha_fail=stats.ALPHA / 2).decision for _ in range(reps)]
    assert decisions.count("pass") / reps <= stats.ALPHA + 0.01
    assert decisions.count("fail") / reps <= stats.ALPHA / 2 + 0.01


# a halved LR, weights rounded (+69 % loss, as the issue measured), a 5 %-worse LM loss, 2 % label noise
@pytest.mark.parametrize("harm, size, shape", [("lr", 0.5, "digits"), ("round", 0.69, "digits"),
                                               ("bias", 0.05, "lm"), ("labels", 0.02, "digits"), ("lr", 0.5, "lm")])
def test_planted_harms_fail_more_often_with_more_seeds(harm, size, shape):
    fails = [_rates(n, 100, seed=2, harm=harm, size=size, shape=shape)["fail"] for n in (2, 3, 5, 10)]
    assert all(b >= a - 0.03 for a, b in zip(fails, fails[1:])), fails  # power grows with n (up to MC noise)
    assert fails[-1] >= 0.9, fails
    passes = [_rates(n, 100, seed=3, harm=harm, size=size, shape=shape)["pass"] for n in (2, 3, 5, 10)]
    assert max(passes) == 0, passes  # a harm this far beyond the tolerance never passed


def test_a_harm_below_the_tolerance_passes_more_often_with_more_seeds():
    passes = [_rates(n, 100, seed=4, harm="bias", size=0.003, shape="lm")["pass"] for n in (2, 3, 5, 10)]
    assert all(b >= a - 0.03 for a, b in zip(passes, passes[1:])) and passes[-1] >= 0.9, passes


# ---------------------------------------------------------------------------------------- informative metrics
def _stuck(value: float, n: int = 3, amp_value: float | None = None):
    """Seeds whose loss curves are real-looking (AMP within 0.2 % of FP32) and whose final metric is ``value``."""
    rng = random.Random(9)
    fp32, amp = {}, {}
    for k in range(n):
        f, a = _seed(rng, shape="lm")
        fp32[k] = RunOutcome(curve=f.curve, final=value, steps=400)
        amp[k] = RunOutcome(curve=a.curve, final=value if amp_value is None else amp_value, steps=400)
    return fp32, amp


def test_a_metric_that_does_not_move_is_not_informative_and_the_loss_decides():
    from ampkit.verify.judge import uninformative

    fp32, amp = _stuck(0.5)
    v = judge(label="BF16", fp32=fp32, amp=amp, metric="accuracy", higher_is_better=True)
    names = [e["name"] for e in v.effects["endpoints"]]
    assert names and all("loss" in n for n in names), names  # only the loss was judged
    assert "does not move" in v.final_metric["not_informative"] and v.final_metric["allowed"] is None
    assert any("not informative" in n and "loss decides" in n for n in v.notes)
    assert uninformative("accuracy", [0.5, 0.5], [0.5, 0.5], None, None, True)
    # FP32 stuck but AMP moved: the metric did tell them apart, so it is judged
    assert uninformative("accuracy", [0.5, 0.5], [0.5, 0.49], None, 1000, True) is None


def test_a_coarse_metric_or_a_tolerance_that_cannot_fail_is_never_used():
    from ampkit.verify.judge import uninformative

    # two printed decimals: one count of 100 is 1.03 % of 0.97, coarser than 1 %
    why = uninformative("accuracy", [0.97, 0.96], [0.97, 0.95], None, None, True)
    assert why and "100 test examples" in why and "coarser" in why
    assert uninformative("accuracy", [0.97, 0.96], [0.97, 0.95], 0.05, None, True) is None  # 5 % resolves it
    assert uninformative("accuracy", [0.9712, 0.9655], [0.9712, 0.9626], None, 359, True) is None  # digits
    assert "cannot fail" in uninformative("auc", [0.9, math.pi / 4], [0.9, 0.8], 1.0, None, True)
    fp32, amp = _stuck(0.5)
    v = judge(label="BF16", fp32=fp32, amp={k: replace(r, final=0.25) for k, r in amp.items()}, metric="accuracy",
              higher_is_better=True, tolerance=1.0)
    assert v.final_metric["allowed"] is None and "cannot fail" in v.final_metric["not_informative"]


# ---------------------------------------------------------------------------------------- --seeds auto
def test_sequential_levels_keep_the_overall_rate_on_fresh_sequences():
    from ampkit.verify.sequential import crossing_rate, nominal_alpha

    level = nominal_alpha(stats.ALPHA, 3, 12)
    assert stats.ALPHA / 10 < level < stats.ALPHA  # between Bonferroni over 10 looks and no correction
    assert crossing_rate(level, 3, 12, reps=40_000, seed=99) <= stats.ALPHA + 0.003
    assert crossing_rate(stats.ALPHA, 3, 12, reps=40_000, seed=99) > 2 * stats.ALPHA  # why a correction is needed
    assert nominal_alpha(stats.ALPHA, 3, 20) < level < nominal_alpha(stats.ALPHA, 3, 6)  # more looks, less each


def _auto(rng: random.Random, last: int = 12, **harm) -> tuple[str, int]:
    from ampkit.verify.sequential import Looks, run_until_decided

    lm = harm.get("shape") == "lm"
    pairs: dict = {}
    looks = Looks(last=last)
    got = {"v": "inconclusive"}

    def decide(seeds):
        got["v"] = judge(label="BF16", fp32={k: pairs[k][0] for k in seeds}, amp={k: pairs[k][1] for k in seeds},
                         metric="val loss" if lm else "accuracy", higher_is_better=not lm,
                         metric_count=None if lm else N_TEST, looks=looks).verdict
        return got["v"]

    used, why = run_until_decided(list(range(last)), looks=looks, train=lambda k: pairs.setdefault(k, _seed(
        rng, **harm)) and [], decide=decide)
    assert why.startswith("decided") == (got["v"] != "inconclusive")
    return got["v"], len(used)


@pytest.mark.parametrize("shape", ["digits", "lm"])
def test_auto_seeds_pass_harmless_runs_in_few_seeds_and_catch_harms(shape):
    rng = random.Random(11)
    none = [_auto(rng, shape=shape) for _ in range(60)]
    assert all(v == "pass" for v, _ in none) and statistics.fmean(n for _, n in none) < 5.5, none
    harmed = [_auto(rng, shape="lm", harm="bias", size=0.03) for _ in range(40)]
    assert all(v == "fail" for v, _ in harmed), harmed


def test_auto_seeds_stop_at_a_hard_failure_and_at_max_seeds():
    from ampkit.verify.sequential import Looks, run_until_decided

    trained = []
    used, why = run_until_decided(list(range(12)), looks=Looks(last=12),
                                  train=lambda k: trained.append(k) or (["NaN"] if k == 1 else []),
                                  decide=lambda s: "inconclusive")
    assert used == [0, 1] and trained == [0, 1] and "NaN" in why
    looked = []
    used, why = run_until_decided(list(range(12)), looks=Looks(last=5), train=lambda k: [],
                                  decide=lambda s: looked.append(len(s)) or "inconclusive")
    assert used == [0, 1, 2, 3, 4] and looked == [3, 4, 5] and "max-seeds 5" in why


def test_a_look_of_auto_is_judged_at_the_designs_nominal_levels():
    from ampkit.verify.sequential import Looks

    rng = random.Random(4)
    pairs = [_seed(rng) for _ in range(4)]
    looks = Looks(last=8)
    v = judge(label="BF16", fp32={k: p[0] for k, p in enumerate(pairs)}, amp={k: p[1] for k, p in enumerate(pairs)},
              metric="accuracy", higher_is_better=True, metric_count=N_TEST, looks=looks)
    ends = v.effects["endpoints"]
    assert len(ends) == 2 and all(e["alpha_pass"] == looks.level(stats.ALPHA) for e in ends)
    assert all(e["alpha_fail"] == looks.level(stats.ALPHA / 2) for e in ends)
    assert v.effects["sequential"]["max_seeds"] == 8
