"""A peer's row is labelled with what it ran (issue 45): Lightning Fabric takes precision="16-mixed" on the CPU and
runs BF16 (a warning, nothing in its return values), so `ampkit bench --precision fp16` must not time that as an
FP16 row. With the real Lightning Fabric."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ampkit.bench.ran_as import AutocastProbe, Substituted, check_ran
from ampkit.cli import main

pytest.importorskip("lightning")


def test_fabric_16_mixed_on_the_cpu_runs_bf16_and_the_probe_sees_it():
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, precision="16-mixed")
    model = nn.Linear(4, 2)
    probe = AutocastProbe(model, "cpu")
    wrapped = fabric.setup(model)
    wrapped(torch.randn(3, 4))
    assert probe.ran == "bf16"
    with pytest.raises(Substituted, match=r"ran BF16 when asked for FP16 \(precision='16-mixed' on cpu"):
        check_ran(probe, "fp16", peer="Lightning Fabric", setting="16-mixed")
    check_ran(probe, "bf16", peer="Lightning Fabric", setting="bf16-mixed")  # what it ran: no complaint
    probe.remove()
    model(torch.randn(3, 4))  # the hook is gone with the probe
    plain_model = nn.Linear(4, 2)
    plain = AutocastProbe(plain_model, "cpu")
    plain_model(torch.randn(3, 4))
    assert plain.ran == "fp32"


def test_bench_drops_fabrics_fp16_row_on_the_cpu_with_a_note(capsys):
    code = main(["bench", "--model", "lesson", "--precision", "fp16", "--runners", "plain,fabric", "--steps", "2",
                 "--warmup", "1", "--device", "cpu", "--json"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    rows = {(row["precision"], row["runner"]): row for row in r["rows"]}
    fp16 = rows[("fp16", "fabric")]
    assert fp16["status"] == "substituted" and fp16["ms_per_step"] is None
    assert "ran BF16 when asked for FP16" in fp16["message"]
    assert any(n.startswith("fabric fp16 (eager) dropped: Lightning Fabric ran BF16") for n in r["notes"])
    assert rows[("fp32", "fabric")]["status"] == "ok"  # "32-true" runs FP32: timed as such
    assert rows[("fp16", "plain")]["status"] == "ok"
