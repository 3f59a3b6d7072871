"""The FP8 plan: a cost model fitted from probe timings, cached per card and version with its provenance, and
the decisions it drives (which layers convert, the refusal when none pays, auto's choice).

The probe itself needs a GPU (its real run is the ``gpu`` test at the end); fitting, caching and deciding are
pure, so they are tested here on timings written out in the tests (synthetic: chosen so each expected
prediction can be worked out by hand, not measurements).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

import ampkit
from ampkit.device import detect_device
from ampkit.device.policy import resolve_precision
from ampkit.engine.fp8 import FP8Filter, convert, plan
from ampkit.engine.fp8_choice import AUTO_MIN_SPEEDUP, choose_fp8
from ampkit.engine.fp8_cost import CostModel, Timing, cache_key, cache_path, load_cached, save_cached
from ampkit.engine.fp8_probe import PROBE_SHAPES, cost_model, device_key
from ampkit.errors import PrecisionUnsupported, UsageError

M = 65536  # tokens a step in the plans below


def _model(slow: float, fast: float, key: dict | None = None, **prov) -> CostModel:
    """FP8/BF16 ratio ``slow`` at size 2^30 (M=1024, 1024x1024), ``fast`` at 2^40 (M=16384, 8192x8192);
    BF16 time 1 ms at 2^30 and 1024 ms at 2^40 (time proportional to work)."""
    key = key or cache_key(card="Test card", capability=(9, 0), torch="2.0", torchao="0.1", recipe="tensorwise",
                           mode="compiled")
    return CostModel(key=key, timings=(Timing(1024, 1024, 1024, 1.0, slow), Timing(16384, 8192, 8192, 1024.0,
                                                                                   1024.0 * fast)),
                     provenance={"source": "recorded", "measured": "2026-12-02T00:00:00+00:00", **prov})


class GPT(nn.Module):
    """A GPT-style stack: embeddings (not Linear), small and large blocks, an odd layer, the head."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(512, 256)
        self.small_qkv = nn.Linear(256, 256)  # M*K*N = 2^16 * 2^8 * 2^8 = 2^32: slower in FP8 below
        self.big_up = nn.Linear(1024, 4096)  # 2^38: faster in FP8
        self.big_down = nn.Linear(4096, 1024)
        self.odd = nn.Linear(1024, 1028)  # not a multiple of 16
        self.lm_head = nn.Linear(1024, 8192)  # the biggest GEMM of all, but the head stays in BF16


# ------------------------------------------------------------------------------ the model's fit
def test_ratio_is_interpolated_over_log_size_and_held_at_the_ends():
    cost = _model(1.2, 0.8)
    assert cost.ratio(1024, 1024, 1024) == pytest.approx(1.2)
    assert cost.ratio(16384, 8192, 8192) == pytest.approx(0.8)
    assert cost.ratio(2**15, 2**10, 2**10) == pytest.approx(1.0)  # size 2^35: half way
    assert cost.ratio(16, 16, 16) == pytest.approx(1.2)  # below every probed size: the smallest's ratio
    assert cost.ratio(2**16, 2**16, 2**16) == pytest.approx(0.8)  # above: the largest's
    bf16, fp8 = cost.predict(2**15, 2**10, 2**10)
    assert bf16 == pytest.approx(32.0) and fp8 == pytest.approx(32.0)  # time in proportion to the work
    assert cost.predict(2**17, 2**12, 2**12)[0] == pytest.approx(2048.0)  # extrapolated past the largest
    assert not cost.pays(2**15, 2**10, 2**10) and cost.pays(16384, 8192, 8192)


def test_timings_of_one_size_are_averaged_and_bad_ones_dropped():
    cost = CostModel(key={"mode": "eager"}, timings=(Timing(64, 64, 64, 1.0, 2.0), Timing(64, 64, 64, 1.0, 1.0),
                                                     Timing(32, 32, 32, 0.0, 1.0)))
    assert len(cost.timings) == 2 and cost.ratio(64, 64, 64) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="at least one timing"):
        CostModel(key={}, timings=(Timing(8, 8, 8, -1.0, 1.0),))


# ------------------------------------------------------------------------------ the plan
def test_plan_converts_the_layers_that_pay_and_says_why_it_keeps_each_other():
    report = plan(GPT(), tokens=M, cost=_model(1.4, 0.7))
    assert report.converted == ("big_up", "big_down")
    kept = dict(report.kept)
    assert kept["lm_head"] == "output head"  # excluded before any cost: the logits' precision
    assert "not divisible by 16" in kept["odd"]
    assert kept["small_qkv"].startswith("slower in FP8 compiled: predicted 0.")
    assert "M=65536 K=256 N=256" in kept["small_qkv"]
    assert "tok" not in kept  # an embedding is no nn.Linear: never considered
    names = [p[0] for p in report.predicted]
    assert names == ["small_qkv", "big_up", "big_down"]  # the judged layers: not the head, not the odd one
    bf16, planned = report.predicted_ms()
    assert planned < bf16 and report.speedup == pytest.approx(bf16 / planned)
    line = report.summary()
    assert f"predicted {report.speedup:.2f}x on the linear layers at 65536 tokens a step" in line
    assert "cost model: recorded on Test card (torch 2.0, torchao 0.1, compiled), 2026-12-02" in line
    d = report.to_dict()
    assert d["tokens"] == M and d["mode"] == "compiled" and d["predicted"][0]["name"] == "small_qkv"


def test_more_tokens_make_a_layer_pay_and_the_filter_still_applies():
    cost = _model(1.4, 0.7)
    assert "small_qkv" not in plan(GPT(), tokens=M, cost=cost).converted
    assert "small_qkv" in plan(GPT(), tokens=2**24, cost=cost).converted  # 2^40 work: the large-GEMM ratio
    assert plan(GPT(), FP8Filter(keep=("big_*",)), tokens=2**24, cost=cost).converted == ("small_qkv",)
    assert "lm_head" in plan(GPT(), FP8Filter(keep_head=False), tokens=M, cost=cost).converted
    assert plan(GPT(), FP8Filter(min_features=4096), tokens=2**24, cost=cost).converted == ()  # an explicit floor
    no_cost = plan(GPT())  # without a cost model: the 256 floor, nothing predicted
    assert no_cost.converted == ("small_qkv", "big_up", "big_down") and no_cost.speedup is None
    with pytest.raises(UsageError, match="needs tokens"):
        plan(GPT(), cost=cost)


# ------------------------------------------------------------------------------ the cache
def test_cache_reuses_a_model_only_for_the_same_card_and_versions_with_its_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "sub" / "cost.json"))
    path = cache_path()
    assert path == tmp_path / "sub" / "cost.json"
    cost = _model(1.2, 0.8, ampkit_commit="abc")
    save_cached(cost)
    back = load_cached(cost.key)
    assert back == cost and back.provenance["ampkit_commit"] == "abc" and back.provenance["source"] == "recorded"
    for change in ({"torch": "2.1"}, {"torchao": "0.2"}, {"card": "Other card"}, {"capability": [8, 9]},
                   {"mode": "eager"}, {"recipe": "rowwise"}):
        assert load_cached({**cost.key, **change}) is None, change
    other = _model(1.0, 0.5, {**cost.key, "torch": "2.1"})
    save_cached(other)  # a second entry beside the first
    assert load_cached(cost.key) == cost and load_cached(other.key) == other
    save_cached(dataclasses.replace(other, provenance={"source": "probe"}))  # replaces its own entry only
    assert len(json.loads(path.read_text())["entries"]) == 2
    path.write_text("{not json")
    assert load_cached(cost.key) is None  # unreadable: as if empty, and the next save rewrites it
    save_cached(cost)
    assert load_cached(cost.key) == cost


def test_default_cache_location_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("AMPKIT_FP8_COST_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_path() == tmp_path / "ampkit" / "fp8-cost.json"


def test_cost_model_on_this_card_comes_from_the_cache_or_says_why_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cost.json"))
    cpu = detect_device("cpu")
    none, why = cost_model(cpu, "tensorwise", "eager")
    assert none is None and "the probe runs on accelerators only" in why
    key = device_key(cpu, "tensorwise", "eager")
    assert key["card"] == cpu.name and key["torch"] == torch.__version__
    save_cached(_model(1.2, 0.8, key))
    found, how = cost_model(cpu, "tensorwise", "eager")
    assert found is not None and found.key == key and how == f"cached in {tmp_path / 'cost.json'}"
    assert cost_model(cpu, "tensorwise", "compiled")[0] is None  # eager figures do not stand for compiled


# ------------------------------------------------------------------------------ the decision
def _fp8_precision():
    return dataclasses.replace(resolve_precision("bf16", "cpu"), name="fp8", reason="test: fp8 on the CPU")


def _lookup(cost):
    return lambda precision, recipe, mode: (cost, "cached in test") if cost else (None, "no model here")


def test_explicit_fp8_that_no_layer_pays_for_is_refused_in_one_line_with_the_fix():
    slow = _model(2.0, 1.5, {"mode": "eager", "card": "Test card", "torch": "2.0", "torchao": "0.1"})
    with pytest.raises(PrecisionUnsupported) as err:
        choose_fp8(GPT(), _fp8_precision(), auto=False, recipe="tensorwise", tokens=M, mode="eager",
                   lookup=_lookup(slow))
    msg = str(err.value)
    assert msg.startswith("FP8 would make this run slower: no linear layer of GPT is predicted faster in FP8 eager "
                          "at 65536 tokens a step (best: big_up 0.")
    assert "compile the model (ampkit bench --compile), use --precision bf16, or --fp8-layers eligible" in msg
    assert "\n" not in msg
    compiled = dataclasses.replace(slow, key={**slow.key, "mode": "compiled"})
    with pytest.raises(PrecisionUnsupported, match="FP8 pays on larger layers or more tokens a step"):
        choose_fp8(GPT(), _fp8_precision(), auto=False, recipe="tensorwise", tokens=M, mode="compiled",
                   lookup=_lookup(compiled))


def test_explicit_fp8_converts_what_pays_eligible_skips_the_check_and_no_model_falls_back_to_shapes():
    prec = _fp8_precision()
    kw = dict(auto=False, recipe="tensorwise", tokens=M, mode="compiled")
    paying = choose_fp8(GPT(), prec, lookup=_lookup(_model(1.4, 0.7)), **kw)
    assert paying.precision is prec and paying.report.converted == ("big_up", "big_down")
    assert paying.note.endswith("; cached in test")
    eligible = choose_fp8(GPT(), prec, layers="eligible", lookup=_lookup(_model(2.0, 1.5)), **kw)
    assert eligible.report.converted == ("small_qkv", "big_up", "big_down")
    assert eligible.note.endswith("(--fp8-layers eligible: speed not checked)")
    shapes = choose_fp8(GPT(), prec, lookup=_lookup(None), **kw)
    assert shapes.report.converted == eligible.report.converted
    assert shapes.note.endswith("layers chosen by shape: no model here")
    with pytest.raises(UsageError, match="--fp8-layers must be one of paying, eligible"):
        choose_fp8(GPT(), prec, layers="all", **kw)


def test_auto_picks_fp8_only_on_an_fp8_card_when_the_plan_predicts_enough(simulated_cuda, monkeypatch):
    kw = dict(auto=True, recipe="tensorwise", tokens=M, mode="compiled")
    cpu_bf16 = resolve_precision("bf16", "cpu")
    import ampkit.device.policy as policy

    with monkeypatch.context() as m:  # the card table says no FP8: decided without probing the card again
        m.setattr(policy, "capabilities", lambda *a, **k: pytest.fail("probed a card the table rules out"))
        kept = choose_fp8(GPT(), cpu_bf16, lookup=_lookup(_model(1.4, 0.5)), **kw)
    assert kept.precision is cpu_bf16 and kept.report is None and kept.note is None  # no FP8 on the CPU at all
    simulated_cuda((9, 0), "NVIDIA H200")
    import ampkit.compat as compat
    import ampkit.device.hardware as hardware

    monkeypatch.setattr(compat, "torchao_missing", lambda: None)
    monkeypatch.setattr(hardware, "probe_fp8", lambda device: hardware.ProbeResult(True, "pass (test)"))
    bf16 = resolve_precision("auto", probe=False)
    assert bf16.name == "bf16"
    chosen = choose_fp8(GPT(), bf16, lookup=_lookup(_model(1.4, 0.5)), **kw)
    assert chosen.precision.name == "fp8" and chosen.report.converted == ("big_up", "big_down")
    reason = chosen.precision.reason
    assert reason.startswith("auto: FP8 tensorwise: 2 of 5") and "--precision bf16 to keep" in reason
    small_gain = choose_fp8(GPT(), bf16, lookup=_lookup(_model(1.0, 0.92)), **kw)  # pays, but below 1.10x
    assert small_gain.precision is bf16 and small_gain.report is None
    assert small_gain.note.startswith("auto: BF16; FP8 tensorwise compiled is predicted 1.0")
    assert f"auto takes FP8 from {AUTO_MIN_SPEEDUP:.2f}x" in small_gain.note
    unknown = choose_fp8(GPT(), bf16, lookup=_lookup(None), **kw)
    assert unknown.precision is bf16 and unknown.note == "auto: BF16; FP8 not weighed (no model here)"


# ------------------------------------------------------------------------------ through train and bench
def _task():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(512, 256, generator=g), torch.randint(0, 16, (512,), generator=g)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 16))
    return ampkit.Task(name="fp8-mlp", model=model, batch=lambda s: (x[:64], y[:64]),
                       loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), samples_per_batch=64)


def test_train_uses_the_cached_cost_model_of_this_card_and_refuses_fp8_that_cannot_pay(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cost.json"))
    key = device_key(detect_device("cpu"), "tensorwise", "eager")  # train steps run eagerly: the eager model
    save_cached(_model(3.0, 2.0, key))
    config = ampkit.TrainConfig(task="fp8-mlp", precision="fp8", steps=2, evaluate=False)
    with pytest.raises(PrecisionUnsupported, match="FP8 would make this run slower: no linear layer of Sequential "
                                                   "is predicted faster in FP8 eager at 64 tokens a step"):
        ampkit.train(config, task=_task(), precision=_fp8_precision())
    task = _task()
    result = ampkit.train(dataclasses.replace(config, fp8_layers="eligible"), task=task, precision=_fp8_precision())
    assert type(task.model[0]).__name__ == "Float8Linear" and result.final_loss is not None
    save_cached(_model(0.5, 0.5, key))  # every size pays: the first two layers convert, the head stays
    task = _task()
    result = ampkit.train(config, task=task, precision=_fp8_precision())
    assert [type(m).__name__ for m in task.model[::2]] == ["Float8Linear", "Float8Linear", "Linear"]
    assert any("predicted 2.00x on the linear layers at 64 tokens a step" in n for n in result.notes), result.notes
    with pytest.raises(UsageError, match="fp8_layers must be one of paying, eligible"):
        ampkit.TrainConfig(fp8_layers="some").validate()


def test_several_processes_choose_by_shape_alike_without_the_cost_model(tmp_path, monkeypatch):
    # Each rank would probe (or race on the cache) and could decide apart; the plan must be the same everywhere.
    from ampkit.distributed.group import DistContext
    from ampkit.training.setup import _fp8

    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cost.json"))
    save_cached(_model(3.0, 2.0, device_key(detect_device("cpu"), "tensorwise", "eager")))  # would refuse
    config = ampkit.TrainConfig(task="fp8-mlp", precision="fp8")
    ctx = DistContext(rank=1, world_size=2, device=detect_device("cpu"), backend="gloo")
    notes: list[str] = []
    task = _task()
    pytest.importorskip("torchao")
    prec = _fp8(config, ctx, task, task.model, _fp8_precision(), auto=False, notes=notes)
    assert prec.name == "fp8" and type(task.model[0]).__name__ == "Float8Linear"
    assert notes[0].endswith("layers chosen by shape: 2 processes decide alike without the cost model")
    bf16 = resolve_precision("bf16", "cpu")
    assert _fp8(config, ctx, _task(), _task().model, bf16, auto=True, notes=notes) is bf16


def test_bench_refuses_the_fp8_rows_of_a_mode_where_nothing_pays(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from ampkit.bench import core
    from ampkit.bench import BenchConfig, run_bench

    real = core._resolve
    monkeypatch.setattr(core, "_resolve",
                        lambda label, device: _fp8_precision() if label == "fp8" else real(label, device))
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cost.json"))
    save_cached(_model(3.0, 2.0, device_key(detect_device("cpu"), "rowwise", "eager")))
    r = run_bench(BenchConfig(model="digits", task_options={"size": "small", "hidden": 256, "channels": 16},
                              precisions=("fp8",), fp8_recipe=("tensorwise", "rowwise"), steps=1, warmup=0,
                              rounds=1, device="cpu", runners=("plain",)))
    rows = {(row["precision"], row["runner"]): row for row in r["rows"]}
    assert rows[("fp8-tensorwise", "plain")]["status"] == "ok"  # no model for tensorwise here: chosen by shape
    refused = rows[("fp8-rowwise", "plain")]
    assert refused["status"] == "refused" and refused["message"].startswith("FP8 would make this run slower")
    assert r["fp8_plans"]["fp8-rowwise eager"]["refused"] == refused["message"]
    assert r["fp8_plans"]["fp8-tensorwise eager"]["converted"] == ["fc1"]
    assert r["settings"]["fp8_recipe"] == ["tensorwise", "rowwise"] and r["settings"]["fp8_layers"] == "paying"


# ------------------------------------------------------------------------------ issue 26: a compiled model
def test_convert_on_a_compiled_model_converts_the_layers_under_their_own_names():
    pytest.importorskip("torchao")
    model = GPT()
    compiled = torch.compile(model)
    report = convert(compiled)
    assert report.converted == ("small_qkv", "big_up", "big_down")  # no "_orig_mod." in the names
    assert type(model.big_up).__name__ == "Float8Linear" and type(model.lm_head) is nn.Linear


# ------------------------------------------------------------------------------ the probe (a GPU)
@pytest.mark.gpu
def test_gpu_probe_measures_caches_and_is_reused(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    monkeypatch.setenv("AMPKIT_FP8_COST_CACHE", str(tmp_path / "cost.json"))
    device = detect_device()
    cost, how = cost_model(device, "tensorwise", "eager")
    assert cost is not None and how.startswith("probed in "), how
    assert len(cost.timings) == len(PROBE_SHAPES) and all(t.bf16_ms > 0 and t.fp8_ms > 0 for t in cost.timings)
    assert cost.provenance["source"] == "probe" and cost.key["card"] == device.name
    assert all(math.isfinite(cost.ratio(*s)) for s in PROBE_SHAPES)
    again, how = cost_model(device, "tensorwise", "eager")
    assert again == cost and how.startswith("cached in ")


def test_the_compiled_probe_lifts_dynamos_recompile_limit_only_inside():
    # Past the limit Dynamo runs a frame eagerly without a word: six shapes compiled twice would time eager FP8.
    import torch._dynamo

    from ampkit.compat import recompile_limit

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    before = getattr(cfg, name)
    with recompile_limit(before + 12):
        assert getattr(cfg, name) == before + 12
    assert getattr(cfg, name) == before
    with recompile_limit(1):  # never lowered
        assert getattr(cfg, name) == before
