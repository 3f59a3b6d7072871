"""The measured FP8 decision (issue 42): candidates, the rule, the trial, its cache, and the commands that use it.

Timings here are injected by the tests (a fake ``measure`` returning scripted milliseconds): the rule, the cache and
the routing are pure logic. The real timing (copies of the model trained on the device) runs in the ``gpu`` test at
the end, and its figures are in benchmarks/results/h200-2026-12-04-fp8-decision-*.json.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

import ampkit
from ampkit.device import detect_device
from ampkit.device.policy import resolve_precision
from ampkit.engine.fp8_choice import TrialSetup, choose_fp8, measured_decision
from ampkit.engine.fp8_cost import CostModel, Timing, cache_key
from ampkit.engine.fp8_trial import BF16, ELIGIBLE, Candidate, Measured, candidates, judge, run_trial
from ampkit.engine.fp8_trial_cache import cache_path, load_trial, save_trial, trial_key
from ampkit.errors import PrecisionUnsupported


class Block(nn.Module):
    def __init__(self, d: int = 256):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.q_proj(x) + self.k_proj(x))))


class Net(nn.Module):
    """Four blocks and a head: attention-like and MLP-like layers, numbered blocks."""

    def __init__(self, n: int = 4, d: int = 256):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.lm_head = nn.Linear(d, 16)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.lm_head(x)


def _fp8():
    return dataclasses.replace(resolve_precision("bf16", "cpu"), name="fp8", reason="test: fp8 on the CPU")


def _fake(ms: dict[str, list[float]], calls: list | None = None):
    """A measure whose timers return the scripted milliseconds, round after round; ``calls`` records the order."""
    built = []

    def measure(c: Candidate):
        built.append(c.name)
        values = list(ms[c.name])

        def timer():
            if calls is not None:
                calls.append(c.name)
            return values.pop(0)
        return timer
    measure.built = built
    return measure


def _setup(ms, tmp_path, **kw):
    return TrialSetup(measure=_fake(ms), batch=(torch.zeros(8, 256),), card="Test card", capability=(9, 0),
                      cache_file=tmp_path / "decisions.json", **kw)


# ------------------------------------------------------------------------------ the rule
def test_the_fastest_wins_only_beyond_the_spread_and_by_at_least_3_percent():
    bf16 = Measured(BF16, 0, (100.0, 101.0, 99.0))
    win, why = judge([bf16, Measured(ELIGIBLE, 9, (90.0, 90.5, 89.5))])
    assert win == ELIGIBLE and "+10.0%" in why and "beyond the spread (2.00 ms)" in why
    win, why = judge([bf16, Measured(ELIGIBLE, 9, (97.5, 97.6, 97.4))])  # beyond the spread, but 2.5 %
    assert win == BF16 and why.startswith("BF16 kept") and "below the 3% a gain must reach" in why
    noisy = Measured(BF16, 0, (100.0, 120.0, 90.0))
    win, why = judge([noisy, Measured(ELIGIBLE, 9, (90.0, 91.0, 89.0))])  # 10 % but the rounds spread 30 ms
    assert win == BF16 and "within the spread of the rounds (30.00 ms)" in why
    win, why = judge([bf16, Measured(ELIGIBLE, 9, (120.0, 121.0, 119.0))])
    assert win == BF16 and why == "BF16 was fastest (100.00 ms a step)"
    win, _ = judge([bf16, Measured(ELIGIBLE, 9, (90.0,) * 3)], min_gain=0.15)  # auto asks for more
    assert win == BF16
    with pytest.raises(ValueError, match="BF16 row"):
        judge([Measured(ELIGIBLE, 9, (1.0,))])


def test_the_trial_interleaves_rounds_reverses_every_other_and_drops_a_candidate_that_fails():
    calls: list[str] = []
    cands = [Candidate(BF16, (), "ref"), Candidate(ELIGIBLE, ("a",), "all"), Candidate("x", ("b",), "other")]
    ms = {BF16: [100.0, 100.0, 100.0], ELIGIBLE: [90.0, 90.0, 90.0], "x": [80.0, 80.0, 80.0]}
    events: list[dict] = []
    r = run_trial(cands, _fake(ms, calls), mode="compiled", recipe="tensorwise", rounds=3, progress=events.append)
    assert calls == [BF16, ELIGIBLE, "x", "x", ELIGIBLE, BF16, BF16, ELIGIBLE, "x"]
    assert r.winner == "x" and r.converted == ("b",) and r.trial_s >= 0
    assert [e["phase"] for e in events][:2] == ["start", "build"] and events[-1]["phase"] == "done"
    assert r.summary().startswith("FP8 trial (compiled, tensorwise): bf16 100.00 ms (spread 0.00); fp8-eligible "
                                  "90.00 ms")

    def failing(c):
        if c.name == "x":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore")
        return _fake(ms)(c)
    r = run_trial(cands, failing, mode="eager", recipe="tensorwise", rounds=2)
    assert r.winner == ELIGIBLE and [m.name for m in r.rows] == [BF16, ELIGIBLE]
    assert r.failed == (("x", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"),)
    assert "x failed: RuntimeError: CUDA out of memory" in r.summary()


# ------------------------------------------------------------------------------ the candidates
def _cost(ratio_small: float, ratio_big: float) -> CostModel:
    key = cache_key(card="Test card", capability=(9, 0), torch="2.0", torchao="0.1", recipe="tensorwise",
                    mode="compiled")
    return CostModel(key=key, timings=(Timing(1024, 256, 256, 1.0, ratio_small),
                                       Timing(1024, 256, 512, 2.0, 2.0 * ratio_big)),
                     provenance={"source": "recorded", "measured": "2026-12-04"})


def test_candidates_bf16_and_eligible_first_then_pruned_sets_ordered_by_the_cost_model():
    model = Net()
    cands = candidates(model, recipe="tensorwise", limit=5)
    names = [c.name for c in cands]
    assert names == [BF16, ELIGIBLE, "attention-bf16", "ends-bf16"]
    by = {c.name: c for c in cands}
    assert by[BF16].converted == () and len(by[ELIGIBLE].converted) == 16  # 4 blocks x 4; the head stays
    assert not any("proj" in n for n in by["attention-bf16"].converted)
    assert not any(n.startswith(("layers.0.", "layers.3.")) for n in by["ends-bf16"].converted)
    assert len(candidates(model, recipe="tensorwise", limit=3)) == 3
    # The cost model's pick (only the up/down layers pay: the attention-bf16 set, pruned as a duplicate) comes with
    # a predicted speedup and is ordered before ends-bf16 (which converts slow layers too); the trial decides.
    costed = candidates(model, recipe="tensorwise", cost=_cost(1.5, 0.5), tokens=1024, limit=5)
    assert [c.name for c in costed] == [BF16, ELIGIBLE, "cost-model", "ends-bf16"]
    assert all(n.endswith(("up", "down")) for n in costed[2].converted)
    assert costed[2].predicted > costed[3].predicted and costed[0].predicted == 1.0
    # A set equal to one already tried is pruned: with no attention layers, attention-bf16 is the eligible set.
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.Linear(256, 8))
    assert [c.name for c in candidates(mlp, recipe="tensorwise", limit=5)] == [BF16, ELIGIBLE]
    tiny = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    assert [c.name for c in candidates(tiny, recipe="tensorwise")] == [BF16]


# ------------------------------------------------------------------------------ the cache
def test_cache_key_holds_structure_batch_card_mode_and_versions(tmp_path):
    kw = dict(card="Test card", capability=(9, 0), mode="compiled", recipe="tensorwise", min_gain=0.03)
    key = trial_key(Net(), (torch.zeros(8, 256),), **kw)
    assert key == trial_key(Net(), (torch.ones(8, 256),), **kw)  # values and weights do not matter
    assert key["torch"] == torch.__version__ and key["ampkit"] == ampkit.__version__ and "torchao" in key
    others = [trial_key(Net(n=3), (torch.zeros(8, 256),), **kw),  # another structure
              trial_key(Net(), (torch.zeros(16, 256),), **kw),  # another batch
              trial_key(Net(), (torch.zeros(8, 256),), **{**kw, "mode": "eager"}),
              trial_key(Net(), (torch.zeros(8, 256),), **{**kw, "card": "Other card"}),
              trial_key(Net(), (torch.zeros(8, 256),), **{**kw, "recipe": "rowwise"})]
    assert all(o != key for o in others)


def test_a_decision_is_measured_once_cached_with_provenance_and_reused(tmp_path, monkeypatch):
    ms = {BF16: [100.0] * 3, ELIGIBLE: [90.0] * 3, "attention-bf16": [95.0] * 3}
    setup = _setup(ms, tmp_path, rounds=3)
    first = measured_decision(Net(), setup, recipe="tensorwise", mode="compiled")
    assert first.winner == ELIGIBLE and first.cached is None and setup.measure.built == [BF16, ELIGIBLE,
                                                                                         "attention-bf16"]
    prov = first.provenance
    assert prov["source"] == "trial" and prov["measured"][:4].isdigit() and "ampkit_commit" in prov
    stored = json.loads((tmp_path / "decisions.json").read_text())
    assert stored["entries"][0]["result"]["winner"] == ELIGIBLE
    again = _setup(ms, tmp_path)
    events: list[dict] = []
    second = measured_decision(Net(), dataclasses.replace(again, progress=events.append), recipe="tensorwise",
                               mode="compiled")
    assert again.measure.built == [] and second.cached == str(tmp_path / "decisions.json")
    assert second.converted == first.converted and events[0]["phase"] == "cached"
    assert "cached from a trial of" in second.summary()
    other_mode = _setup(ms, tmp_path)
    measured_decision(Net(), other_mode, recipe="tensorwise", mode="eager")
    assert other_mode.measure.built  # another mode: measured again
    fresh = _setup(ms, tmp_path, use_cache=False)
    measured_decision(Net(), fresh, recipe="tensorwise", mode="compiled")
    assert fresh.measure.built
    (tmp_path / "decisions.json").write_text("{not json")
    assert load_trial({"any": 1}, tmp_path / "decisions.json") is None  # unreadable: as if empty
    save_trial({"any": 1}, second, tmp_path / "decisions.json")
    assert load_trial({"any": 1}, tmp_path / "decisions.json").winner == ELIGIBLE


def test_cache_location_follows_the_override_then_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPKIT_FP8_DECISION_CACHE", str(tmp_path / "x.json"))
    assert cache_path() == tmp_path / "x.json"
    monkeypatch.delenv("AMPKIT_FP8_DECISION_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_path() == tmp_path / "ampkit" / "fp8-decisions.json"


# ------------------------------------------------------------------------------ the decision
def test_explicit_fp8_converts_the_fastest_set_or_is_refused_with_the_measured_reason(tmp_path):
    kw = dict(auto=False, recipe="tensorwise", tokens=1024, mode="compiled", lookup=lambda *a: (None, "none"))
    ms = {BF16: [100.0] * 3, ELIGIBLE: [96.0] * 3, "attention-bf16": [90.0] * 3}
    choice = choose_fp8(Net(), _fp8(), trial=_setup(ms, tmp_path), **kw)
    assert choice.trial.winner == "attention-bf16"
    assert len(choice.report.converted) == 8 and not any("proj" in n for n in choice.report.converted)
    kept = dict(choice.report.kept)
    assert kept["lm_head"] == "output head"
    assert kept["layers.0.q_proj"] == "BF16 in the fastest layer set measured (attention-bf16)"
    assert "FP8 trial (compiled, tensorwise)" in choice.note and "attention-bf16 90.00 vs BF16 100.00" in choice.note
    slow = {BF16: [100.0] * 3, ELIGIBLE: [99.0] * 3, "attention-bf16": [101.0] * 3}
    with pytest.raises(PrecisionUnsupported) as err:
        choose_fp8(Net(), _fp8(), trial=_setup(slow, tmp_path / "b"), **kw)
    msg = str(err.value)
    assert msg.startswith("FP8 would not make this run faster, measured on the model: FP8 trial (compiled")
    assert "below the 3% a gain must reach" in msg and msg.endswith("--fp8-layers eligible to train in FP8 anyway")
    assert "\n" not in msg and err.value.trial.winner == BF16
    eligible = choose_fp8(Net(), _fp8(), layers="eligible", trial=_setup(slow, tmp_path / "c"), **kw)
    assert eligible.trial is None and len(eligible.report.converted) == 16  # the explicit override: no trial


# ------------------------------------------------------------------------------ through train, compare and bench
def _task():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(256, 256, generator=g), torch.randint(0, 16, (256,), generator=g)
    return ampkit.Task(name="fp8-net", model=Net(n=3), batch=lambda s: (x[:32], y[:32]),
                       loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), samples_per_batch=32)


@pytest.fixture
def trial_here(tmp_path, monkeypatch):
    """Make train/compare time on this CPU with scripted figures (product code runs trials on accelerators only)."""
    pytest.importorskip("torchao")
    from ampkit.training import fp8_decision

    seen: list[dict] = []
    ms = {BF16: [100.0] * 3, ELIGIBLE: [80.0] * 3, "attention-bf16": [90.0] * 3}

    def fake(**kw):
        seen.append(kw)
        return _setup(ms, tmp_path, progress=kw["progress"])
    monkeypatch.setattr(fp8_decision, "trial_setup", fake)
    return seen


def test_train_decides_fp8_by_the_trial_and_shows_it(trial_here):
    task = _task()
    events: list[dict] = []
    result = ampkit.train(ampkit.TrainConfig(task="fp8-net", precision="fp8", steps=2, evaluate=False),
                          task=task, precision=_fp8(), progress=events.append)
    assert len(trial_here) == 1 and trial_here[0]["task"] is task
    assert type(task.model.layers[0].q_proj).__name__ == "Float8Linear"  # fp8-eligible measured fastest
    assert type(task.model.lm_head) is nn.Linear
    assert any("FP8 trial (eager, tensorwise)" in n and "fp8-eligible 80.00 vs BF16 100.00" in n
               for n in result.notes), result.notes
    assert any(e.get("event") == "fp8_trial" and e["phase"] == "done" for e in events)


def test_compare_trains_its_fp8_runs_through_the_same_decision(trial_here):
    from ampkit.verify.runs import RunPlan

    plan = RunPlan(make=lambda seed: _task(), seeds=(0,), steps=2, log_every=1, lr=None,
                   fp32=resolve_precision("fp32", "cpu"), amp=_fp8())
    task, run = plan.run(0, _fp8(), evaluate=False)
    assert len(trial_here) == 1 and type(task.model.layers[0].up).__name__ == "Float8Linear"
    assert any("FP8 trial" in n for n in run.result.notes)


def test_bench_fp8_rows_use_the_trial_and_record_it(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from ampkit.bench import BenchConfig, core, fp8rows, run_bench

    real = core._resolve
    monkeypatch.setattr(core, "_resolve", lambda label, device: _fp8() if label == "fp8" else real(label, device))
    ms = {BF16: [100.0], ELIGIBLE: [80.0], "attention-bf16": [90.0]}
    made: list[bool] = []

    def fake(config, wl, prec, recipe, compiled, progress=None):
        made.append(compiled)
        return _setup(ms, tmp_path, rounds=1, progress=progress)
    monkeypatch.setattr(fp8rows, "trial_setup", fake)
    events: list[dict] = []
    r = run_bench(BenchConfig(model="digits", task_options={"size": "small", "hidden": 256, "channels": 16},
                              precisions=("fp8",), steps=1, warmup=0, rounds=1, device="cpu", runners=("plain",)),
                  progress=events.append)
    assert made == [False]
    plan = r["fp8_plans"]["fp8 eager"]
    assert plan["trial"]["winner"] == ELIGIBLE and plan["converted"] == plan["trial"]["converted"]
    assert any(e.get("event") == "fp8_trial" for e in events)
    slow = {BF16: [100.0], ELIGIBLE: [120.0], "attention-bf16": [110.0]}
    monkeypatch.setattr(fp8rows, "trial_setup",
                        lambda *a, **k: _setup(slow, tmp_path / "slow", rounds=1))
    r = run_bench(BenchConfig(model="digits", task_options={"size": "small", "hidden": 256, "channels": 16},
                              precisions=("fp8",), steps=1, warmup=0, rounds=1, device="cpu", runners=("plain",)))
    row = next(x for x in r["rows"] if x["precision"] == "fp8")
    assert row["status"] == "refused" and row["message"].startswith("FP8 would not make this run faster")
    assert r["fp8_plans"]["fp8 eager"]["trial"]["winner"] == BF16


def test_cli_shows_each_phase_of_the_trial():
    from ampkit.cli.fp8view import fp8_trial_line

    start = fp8_trial_line({"event": "fp8_trial", "phase": "start", "mode": "compiled",
                            "candidates": [{"name": BF16, "converted": 0}, {"name": ELIGIBLE, "converted": 154}]})
    assert start == ("FP8 decision: timing 2 layer sets on this model (compiled): bf16 (0 layers in FP8), "
                     "fp8-eligible (154 layers in FP8)")
    assert fp8_trial_line({"event": "fp8_trial", "phase": "round", "candidate": BF16, "round": 0,
                           "ms": 147.3}) == "  FP8 trial round 1: bf16 147.30 ms/step"
    assert fp8_trial_line({"event": "fp8_trial", "phase": "done", "summary": "S"}) == "S"
    assert fp8_trial_line({"event": "runner"}) is None


# ------------------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
def test_gpu_trial_times_real_steps_and_converts_the_winner(tmp_path):
    pytest.importorskip("torchao")
    from ampkit.engine.fp8 import convert
    from ampkit.engine.fp8_trial_steps import StepTrial

    device = detect_device(None)
    prec = resolve_precision("fp8", device)
    model = Net(n=4, d=1024).to(device.torch_device)
    batches = [(torch.randn(8192, 1024, device=device.torch_device),
                torch.randint(0, 16, (8192,), device=device.torch_device)) for _ in range(2)]
    loss = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])  # noqa: E731
    steps = StepTrial(model=model, loss=loss, batches=batches, precision=prec, device=device, recipe="tensorwise",
                      make_optimizer=lambda m: torch.optim.AdamW(m.parameters(), fused=True))
    setup = TrialSetup(measure=steps, batch=batches[0], card=device.name, capability=device.capability,
                       release=steps.release, cache_file=tmp_path / "d.json")
    result = measured_decision(model, setup, recipe="tensorwise", mode="eager")
    assert [r.name for r in result.rows][:2] == [BF16, ELIGIBLE]
    assert all(len(r.ms_rounds) == 3 and min(r.ms_rounds) > 0 for r in result.rows)
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))  # copies were timed
    assert json.loads((tmp_path / "d.json").read_text())["entries"][0]["result"]["winner"] == result.winner
    if result.fp8:
        from ampkit.engine.fp8_trial import to_report

        report = convert(model, chosen=to_report(model, result))
        assert report.converted == result.converted


def test_train_compare_and_bench_progress_views_print_the_trial(capsys):
    from ampkit.cli.bench import _Progress as BenchView
    from ampkit.cli.compare import _Progress as CompareView
    from ampkit.cli.train import _Bar as TrainView

    ev = {"event": "fp8_trial", "phase": "done", "summary": "FP8 trial (eager, tensorwise): bf16 1.00 ms: S"}
    for view in (BenchView(), TrainView(enabled=False), CompareView(enabled=False, quiet=False)):
        view(ev)
        assert "FP8 trial (eager, tensorwise): bf16 1.00 ms: S" in capsys.readouterr().err, view
