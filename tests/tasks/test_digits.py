"""The digits task: real scikit-learn data, deterministic batches, and real training to 95 %."""

from __future__ import annotations

import contextlib

import pytest
import torch

import ampkit
from ampkit.tasks import digits


def test_split_shapes_and_range():
    x_train, y_train, x_test, y_test = digits.load_split()
    assert x_train.shape[1:] == (1, 8, 8) and x_test.shape[1:] == (1, 8, 8)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert len(x_train) + len(x_test) == 1797 and len(x_test) == 359
    assert 0.0 <= float(x_train.min()) and float(x_train.max()) <= 1.0
    assert set(y_train.tolist()) == set(y_test.tolist()) == set(range(10))


def test_batch_is_a_function_of_seed_and_step():
    a, b, c = digits.make_task(seed=0), digits.make_task(seed=0), digits.make_task(seed=1)
    for step in (0, 7, 1000):
        xa, ya = a.batch(step)
        xb, yb = b.batch(step)
        assert xa.shape == (64, 1, 8, 8) and ya.shape == (64,)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa, a.batch(step)[0])  # asking twice, in any order, gives the same batch
    assert not torch.equal(a.batch(0)[0], c.batch(0)[0])


def test_an_epoch_visits_every_training_image_once_even_across_a_boundary():
    x_train, y_train, _, _ = digits.load_split()
    n = len(y_train)
    task = digits.make_task(seed=3, batch_size=1000)  # step 1 straddles the end of epoch 0
    first_epoch = torch.cat([task.batch(0)[1], task.batch(1)[1][: n - 1000]])
    assert torch.equal(first_epoch.sort().values, y_train.sort().values)
    pixels = torch.cat([task.batch(0)[0], task.batch(1)[0][: n - 1000]])
    assert torch.allclose(pixels.sum(), x_train.sum())


def test_every_seed_is_judged_on_the_same_test_set():
    a, b = digits.make_task(seed=0), digits.make_task(seed=5)
    model = a.model.eval()
    with torch.no_grad():
        assert a.evaluate(model, torch.device("cpu")) == b.evaluate(model, torch.device("cpu"))
    assert torch.equal(digits.load_split()[2], digits.load_split()[2])


def test_task_metadata():
    task = digits.make_task()
    assert task.metric == "accuracy" and task.higher_is_better
    assert task.samples_per_batch == 64 and task.flops_per_step > 0 and task.description
    assert any(isinstance(m, torch.nn.Conv2d) for m in task.model.modules())


def test_load_task_builds_it():
    task = ampkit.load_task("digits", seed=1, options={"hidden": 32})
    assert task.name == "digits" and task.model.fc1.out_features == 32


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_reaches_95_percent(precision):
    task = ampkit.load_task("digits", seed=0)
    model = task.model
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    autocast = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype else contextlib.nullcontext
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    for step in range(task.default_steps):
        with autocast():
            loss = task.loss(model, task.batch(step))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    model.eval()
    with torch.no_grad(), autocast():
        metrics = task.evaluate(model, torch.device("cpu"))
    assert metrics["accuracy"] >= 0.95, metrics
    assert isinstance(metrics["loss"], float) and metrics["loss"] < 0.3
