"""The built-in ``llama`` task: a Llama-style decoder on the standard library's bytes, for ``compare`` at the
layer shapes of a 1-3B model (built tiny here)."""

from __future__ import annotations

import pytest
import torch

import ampkit
from ampkit.errors import UsageError
from ampkit.tasks import BUILTIN_TASKS

TINY = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn": 64, "seq_len": 32, "batch_size": 4,
        "corpus_bytes": 20_000, "eval_windows": 8}


def test_batches_are_pure_and_differ_by_seed():
    a = ampkit.load_task("llama", seed=1, options=TINY)
    b = ampkit.load_task("llama", seed=1, options=TINY)
    c = ampkit.load_task("llama", seed=2, options=TINY)
    assert "llama" in BUILTIN_TASKS
    for step in (0, 7):
        assert all(torch.equal(x, y) for x, y in zip(a.batch(step), b.batch(step)))
    assert not torch.equal(a.batch(0)[0], c.batch(0)[0])
    x, y = a.batch(3)
    assert x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < 256
    # Weights come from the seeded global RNG (load_task seeds it): the same seed, the same model.
    assert torch.equal(a.model.blocks[0].q.weight, b.model.blocks[0].q.weight)


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    task = ampkit.load_task("llama", options={**TINY, "lr": 1e-3, "warmup": 4})
    opt = torch.optim.SGD(task.model.parameters(), lr=task.lr)
    sched = task.make_scheduler(opt, 20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))  # never rises after the warm-up
    assert 1e-4 <= lrs[-1] < 1.1e-4  # the last step is one before the end of the cosine


def test_one_step_lowers_the_loss_and_evaluate_reads_the_validation_windows():
    task = ampkit.load_task("llama", options={**TINY, "vocab_size": 320})
    opt = torch.optim.AdamW(task.model.parameters(), lr=3e-3)
    b = task.batch(0)
    before = task.loss(task.model, b)
    assert abs(before.item() - torch.log(torch.tensor(320.0)).item()) < 0.5  # a wide head starts uniform
    for _ in range(5):
        opt.zero_grad()
        task.loss(task.model, b).backward()
        opt.step()
    assert task.loss(task.model, b).item() < before.item() - 0.5
    with torch.no_grad():
        metrics = task.evaluate(task.model, torch.device("cpu"))
    assert set(metrics) == {"loss", "bits_per_byte"} and torch.isfinite(torch.tensor(metrics["loss"]))
    assert task.extra["eval_windows"] == 8 and "validation loss" in task.description


@pytest.mark.parametrize("bad, message", [
    ({"n_kv_heads": 3}, "heads of even size"),
    ({"vocab_size": 100}, "cannot hold the 256 byte values"),
    ({"eval_windows": 0}, "must be positive"),
    ({"corpus_bytes": 500, "seq_len": 64}, "raise corpus_bytes"),
])
def test_bad_options_are_one_line(bad, message):
    with pytest.raises(UsageError, match=message):
        ampkit.load_task("llama", options={**TINY, **bad})


def test_the_model_is_built_on_the_runs_device():
    # The meta device stands for an accelerator: no memory, but where each parameter was created shows.
    task = ampkit.load_task("llama", options=TINY, device="meta")
    assert {p.device.type for p in task.model.parameters()} == {"meta"}
    assert task.batch(0)[0].device.type == "cpu"  # batches stay on the host; the trainer moves them
