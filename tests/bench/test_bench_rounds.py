"""Interleaved rounds, spread and foreign workloads of ``ampkit bench`` (CPU)."""

import json

import pytest
import torch

from ampkit.bench.core import _ratios, combine_rounds
from ampkit.bench.foreign import FOREIGN
from ampkit.bench.workloads import load_workload
from ampkit.cli import main
from ampkit.device import Device
from ampkit.errors import UsageError


def _round(runner: str, ms: float, **kw):
    row = {"precision": "bf16", "compiled": False, "runner": runner, "status": "ok", "ms_per_step": ms,
           "tokens_per_s": None, "samples_per_s": 100.0 / ms, "mfu": 0.5 / ms, "peak_mem_bytes": 7,
           "host_syncs_per_step": 0, "ms_rounds": None, "ms_spread": None}
    row.update(kw)
    return row


def test_combine_takes_the_median_and_keeps_every_round():
    row = combine_rounds([_round("plain", 10.0), _round("plain", 30.0, peak_mem_bytes=99), _round("plain", 12.0)])
    assert row["ms_per_step"] == 12.0 and row["ms_rounds"] == [10.0, 30.0, 12.0] and row["ms_spread"] == [10.0, 30.0]
    assert row["samples_per_s"] == pytest.approx(100.0 / 12.0) and row["mfu"] == pytest.approx(0.5 / 12.0)
    assert row["peak_mem_bytes"] == 7  # memory and syncs come from the first round, the one that checks them


def test_a_failed_round_is_the_row():
    bad = _round("ampkit", 1.0, status="error", message="boom")
    assert combine_rounds([_round("ampkit", 10.0), bad]) is bad


def _pair(plain_ms, amp_ms):
    rows = [combine_rounds([_round("plain", t) for t in plain_ms]),
            combine_rounds([_round("ampkit", t) for t in amp_ms])]
    _ratios(rows)
    return rows[1]


def test_ratio_is_paired_by_round_and_says_when_noise_wins():
    # The device drifts between rounds (10 -> 20 ms) but each round's pair shares it: the paired ratio is
    # exactly 1.02 every round, so the effect is measurable although the times spread over 2x.
    amp = _pair([10.0, 20.0, 15.0], [10.2, 20.4, 15.3])
    assert amp["ratio_to_plain"] == pytest.approx(1.02)
    assert amp["ratio_spread"] == pytest.approx([1.02, 1.02])
    assert amp["ratio_verdict"].startswith("+2.0%")
    # Round-to-round ratios of 0.97..1.05 around a median of 1.01: the spread is wider than the effect.
    noisy = _pair([10.0, 10.0, 10.0], [9.7, 10.1, 10.5])
    assert noisy["ratio_to_plain"] == pytest.approx(1.01)
    assert noisy["ratio_verdict"].startswith("within noise")
    one = _pair([10.0], [10.1])
    assert "one round" in one["ratio_verdict"]


def test_rounds_interleave_and_reverse(monkeypatch):
    from ampkit.bench import core

    order = []
    real = core._measure

    def spy(wl, device, label, prec, compiled, runner, *a, check_syncs=True, **kw):
        order.append((runner, check_syncs))
        return real(wl, device, label, prec, compiled, runner, *a, check_syncs=check_syncs, **kw)

    monkeypatch.setattr(core, "_measure", spy)
    result = core.run_bench(core.BenchConfig(model="lesson", precisions=("fp32",), runners=("plain", "ampkit"),
                                             steps=2, warmup=1, rounds=3))
    assert order == [("plain", True), ("ampkit", True), ("ampkit", False), ("plain", False), ("plain", False),
                     ("ampkit", False)]
    rows = {r["runner"]: r for r in result["rows"]}
    assert len(rows["ampkit"]["ms_rounds"]) == 3 and len(rows["ampkit"]["ratio_rounds"]) == 3
    assert result["settings"]["rounds"] == 3


def test_results_record_commit_and_library_versions(capsys):
    assert main(["bench", "--model", "lesson", "--precision", "fp32", "--runners", "plain,ampkit", "--steps", "2",
                 "--warmup", "1", "--rounds", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    v = r["versions"]
    assert {"git_commit", "torch", "torchvision", "transformers", "torchao", "accelerate"} <= set(v)
    assert v["git_commit"] is None or len(v["git_commit"].split("-")[0]) == 40


def test_rounds_must_be_positive(capsys):
    assert main(["bench", "--model", "lesson", "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_missing_library_is_one_line(monkeypatch):
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: (_ for _ in ()).throw(ImportError("No module named 'torchvision'"))
                        if name == "torchvision" else real(name, *a))
    with pytest.raises(UsageError, match=r"--model resnet50 needs torchvision: pip install 'ampkit\[vision\]'"):
        load_workload("resnet50", Device("cpu"))


def test_foreign_options_are_checked():
    pytest.importorskip("transformers")
    with pytest.raises(UsageError, match="has no option depth"):
        load_workload("hf-gpt2", Device("cpu"), options={"depth": 3})


def test_hf_gpt2_tiny_runs_through_every_core_runner(capsys):
    pytest.importorskip("transformers")
    tiny = ["--task-arg", "n_embd=32", "--task-arg", "n_layer=1", "--task-arg", "n_head=2", "--task-arg",
            "vocab_size=64", "--task-arg", "seq_len=16", "--task-arg", "batch_size=2"]
    assert main(["bench", "--model", "hf-gpt2", *tiny, "--precision", "bf16", "--runners", "plain,ampkit",
                 "--steps", "2", "--warmup", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"]["name"] == "hf-gpt2" and "GPT2LMHeadModel" in r["model"]["description"]
    rows = {(row["precision"], row["runner"]): row for row in r["rows"]}
    assert rows[("bf16", "plain")]["status"] == "ok" and rows[("bf16", "ampkit")]["status"] == "ok"
    # Same model, same batches, same optimizer: the engine's loss equals the hand loop's.
    assert rows[("bf16", "ampkit")]["loss_last"] == pytest.approx(rows[("bf16", "plain")]["loss_last"], rel=1e-3)


def test_resnet50_is_channels_last_with_sgd():
    pytest.importorskip("torchvision", exc_type=ImportError)
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - PyPI's torchvision beside a CPU build of torch can fail to load
        pytest.skip(f"torchvision does not load here: {exc}")
    wl = load_workload("resnet50", Device("cpu"), options={"batch_size": 2, "image_size": 32, "num_classes": 10})
    x = wl.batches[0][0]
    assert x.is_contiguous(memory_format=torch.channels_last)
    opt = wl.optimizer(wl.model.parameters())
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    assert sum(1 for _ in wl.model.parameters()) == 161


def test_foreign_names_are_models():
    from ampkit.bench.workloads import MODEL_NAMES

    assert set(FOREIGN) <= set(MODEL_NAMES)
