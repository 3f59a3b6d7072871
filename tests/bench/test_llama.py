"""``--model llama-1b``: the Llama-style decoder, built tiny on the CPU (the full shape needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from ampkit.bench.llama import LLAMA_1B, LlamaLM
from ampkit.bench.workloads import load_workload
from ampkit.device import detect_device
from ampkit.engine.fp8 import plan
from ampkit.errors import UsageError

TINY = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn": 128, "vocab_size": 96, "seq_len": 16,
        "batch_size": 2}


def test_the_full_shape_is_tinyllama_1_1b():
    with torch.device("meta"):
        model = LlamaLM(**{k: v for k, v in LLAMA_1B.items() if k not in ("batch_size", "lr", "weight_decay")})
    assert sum(p.numel() for p in model.parameters()) == 1_100_048_384
    assert (model.blocks[0].k.out_features, model.blocks[0].gate.out_features) == (256, 5632)  # 4 KV heads of 64


def test_tiny_llama_trains_and_its_plan_keeps_the_head():
    wl = load_workload("llama-1b", detect_device("cpu"), options=TINY)
    assert wl.tokens_per_step == 32 and wl.batches[0][0].shape == (2, 17)  # inputs and shifted targets
    loss = wl.loss(wl.model, wl.batches[0])
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(96.0)).item()) < 0.5
    assert wl.model.blocks[0].q.weight.grad is not None and wl.flops_per_step > 0
    report = plan(wl.model)
    assert dict(report.kept)["lm_head"] == "output head" and "blocks.0.k" in dict(report.kept)  # 64x32: small


def test_bad_options_are_one_line():
    with pytest.raises(UsageError, match="has no option depth"):
        load_workload("llama-1b", detect_device("cpu"), options={"depth": 2})
    with pytest.raises(UsageError, match="heads of even size"):
        load_workload("llama-1b", detect_device("cpu"), options={**TINY, "n_kv_heads": 3})
    with pytest.raises(UsageError, match="needs a GPU"):
        load_workload("llama-1b", detect_device("cpu"))
