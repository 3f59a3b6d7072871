"""``ampkit bench --precision fp8``: FP8 rows time a torchao copy of the model; the other rows keep theirs.

FP8 is refused on this CPU, but torchao's Float8Linear runs here: a Precision named fp8 (BF16 autocast, what
``resolve_precision`` gives on an FP8 card) shows the rows and the model they train; the H200 run times them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ampkit.bench.core as core
from ampkit.bench import BenchConfig, run_bench
from ampkit.bench.workloads import fp8_copy, load_workload
from ampkit.device import detect_device
from ampkit.errors import UsageError
from ampkit.device.policy import resolve_precision

pytest.importorskip("torchao")

OPTIONS = {"size": "small", "hidden": 256, "channels": 16}  # fc1 is 256 -> 256: large enough for FP8


def _fp8_on_cpu(monkeypatch):
    real = core._resolve

    def resolve(label, device):
        if label == "fp8":
            return dataclasses.replace(resolve_precision("bf16", device), name="fp8", reason="test: fp8 on the CPU")
        return real(label, device)

    monkeypatch.setattr(core, "_resolve", resolve)


def test_the_fp8_copy_converts_a_copy_and_keeps_the_weights():
    wl = load_workload("digits", detect_device("cpu"), options=OPTIONS)
    wl8, summary = fp8_copy(wl, "tensorwise")
    assert type(wl8.model.fc1).__name__ == "Float8Linear" and type(wl.model.fc1) is torch.nn.Linear
    assert type(wl8.model.fc2) is torch.nn.Linear  # the 10-way head stays in BF16
    assert summary == "FP8 tensorwise: 1 of 2 linear layers converted; kept in BF16: fc2 (output head)"
    assert wl8.model.state_dict().keys() == wl.model.state_dict().keys()
    for k, v in wl.model.state_dict().items():
        assert torch.equal(wl8.model.state_dict()[k], v), k
    assert wl8.batches is wl.batches


def test_bench_fp8_rows_beside_bf16(monkeypatch):
    _fp8_on_cpu(monkeypatch)
    r = run_bench(BenchConfig(model="digits", task_options=OPTIONS, precisions=("bf16", "fp8"), steps=2, warmup=1,
                              rounds=1, device="cpu"))
    rows = {(row["precision"], row["runner"]): row for row in r["rows"]}
    fp8 = {runner for (prec, runner) in rows if prec == "fp8"}
    assert fp8 == {"plain", "ampkit"}  # no lesson, no peers: they have no torchao path
    assert all(rows[("fp8", runner)]["status"] == "ok" for runner in fp8), rows
    assert rows[("bf16", "lesson")]["status"] == "ok"
    # The FP8 model's losses differ from the BF16 model's: the bf16 rows did not train the converted copy.
    assert rows[("fp8", "plain")]["loss_last"] != rows[("bf16", "plain")]["loss_last"]
    assert rows[("fp8", "plain")]["loss_last"] == pytest.approx(rows[("fp8", "ampkit")]["loss_last"], rel=1e-3)
    assert r["settings"]["fp8_recipe"] == "tensorwise"
    bar = next(b for b in r["bars"] if b["name"] == "fp8 (plan) vs BF16 eager")  # ampkit's rows, BF16 over FP8
    assert bar["bar"] == ">= 1.0x" and bar["pass"] == (bar["value"] >= 1.0)
    ms = {prec: rows[(prec, "ampkit")]["ms_per_step"] for prec in ("bf16", "fp8")}
    assert bar["value"] == pytest.approx(ms["bf16"] / ms["fp8"])
    assert any(n.startswith("fp8 eager rows: FP8 tensorwise:") for n in r["notes"]), r["notes"]


def test_explicit_peers_are_left_out_of_fp8_rows(monkeypatch):
    _fp8_on_cpu(monkeypatch)
    assert core._runners_for(BenchConfig(runners=("plain", "accelerate", "ampkit")), "fp8", False) == ["plain", "ampkit"]
    assert core._runners_for(BenchConfig(runners=("plain", "accelerate")), "bf16", False) == ["plain", "accelerate"]
    assert core._runners_for(BenchConfig(graph=True), "fp8", False) == ["plain", "ampkit", "ampkit-graph"]


def test_bad_recipe_is_one_line():
    with pytest.raises(UsageError, match="--fp8-recipe must be one of tensorwise, rowwise, rowwise_with_gw_hp"):
        BenchConfig(fp8_recipe="delayed").validate()
