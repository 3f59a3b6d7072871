"""The charlm task: the standard library's bytes, causal attention, and a loss that falls."""

from __future__ import annotations

import math

import pytest
import torch

import ampkit
from ampkit.errors import UsageError
from ampkit.tasks import charlm

SMALL = {"d_model": 32, "n_layers": 2, "n_heads": 4}


def test_corpus_is_nonempty_and_deterministic():
    data = charlm.load_corpus(50_000)
    assert data.dtype == torch.uint8 and len(data) == 50_000
    charlm._read_corpus.cache_clear()  # read from disk again, not from the cache
    assert torch.equal(charlm.load_corpus(50_000), data)
    assert b"import" in bytes(data.tolist())  # it is Python source


def test_batch_shapes_targets_and_determinism():
    task = charlm.make_task(seed=0, **SMALL)
    x, y = task.batch(3)
    assert x.shape == y.shape == (16, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one byte
    assert int(x.max()) < 256 and int(x.min()) >= 0
    again = charlm.make_task(seed=0, **SMALL).batch(3)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, charlm.make_task(seed=1, **SMALL).batch(3)[0])
    assert task.tokens_per_batch == 16 * 64 and task.samples_per_batch == 16


def test_model_shapes_blocks_and_wider_vocab():
    task = charlm.make_task(**SMALL)
    assert isinstance(task.model.blocks, torch.nn.ModuleList) and len(task.model.blocks) == 2
    x, _ = task.batch(0)
    assert task.model(x).shape == (16, 64, 256)
    wide = charlm.make_task(vocab_size=512, **SMALL)
    assert wide.model(wide.batch(0)[0]).shape == (16, 64, 512)
    assert wide.flops_per_step > task.flops_per_step > 0


def test_attention_is_causal():
    model = charlm.make_task(**SMALL).model.eval()
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 40] = (changed[:, 40] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_evaluate_is_seed_independent_and_in_bits():
    a, b = charlm.make_task(seed=0, **SMALL), charlm.make_task(seed=7, **SMALL)
    with torch.no_grad():
        ma, mb = a.evaluate(a.model, torch.device("cpu")), b.evaluate(a.model, torch.device("cpu"))
    assert ma == mb
    assert ma["bits_per_byte"] == pytest.approx(ma["loss"] / math.log(2))
    assert a.metric == "loss" and not a.higher_is_better


def test_loss_falls_in_30_steps():
    task = ampkit.load_task("charlm", seed=0, options=SMALL)
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
    with torch.no_grad():
        before = task.evaluate(model, torch.device("cpu"))["loss"]
    for step in range(30):
        loss = task.loss(model, task.batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    with torch.no_grad():
        after = task.evaluate(model, torch.device("cpu"))["loss"]
    assert after < before - 1.0, (before, after)  # from ~ln 256 = 5.5 to below 4.5


def test_bf16_autocast_runs_attention_and_linears_in_bf16():
    task = charlm.make_task(**SMALL)
    seen = {}

    def record(name):
        def hook(module, inputs, output):
            seen[name] = (inputs[0].dtype, output.dtype)
        return hook

    block = task.model.blocks[0]
    block.qkv.register_forward_hook(record("qkv"))
    block.proj.register_forward_hook(record("proj"))  # its input is the attention output
    block.fc.register_forward_hook(record("fc"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = task.model(task.batch(0)[0])
        loss = task.loss(task.model, task.batch(0))
    assert seen["qkv"][1] == torch.bfloat16
    assert seen["proj"] == (torch.bfloat16, torch.bfloat16)
    assert seen["fc"][1] == torch.bfloat16
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32  # cross-entropy is on autocast's FP32 list
    assert all(p.dtype == torch.float32 for p in task.model.parameters())


def test_load_task_and_bad_options():
    task = ampkit.load_task("charlm", options={"d_model": 32})
    assert task.name == "charlm" and task.model.tok.weight.shape == (256, 32)
    with pytest.raises(UsageError, match="divisible"):
        ampkit.load_task("charlm", options={"d_model": 30, "n_heads": 4})
    with pytest.raises(UsageError, match="vocab_size"):
        ampkit.load_task("charlm", options={"vocab_size": 100})
    with pytest.raises(UsageError, match="corpus_bytes"):
        ampkit.load_task("charlm", options={"corpus_bytes": 500})
