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


# ------------------------------------------------------------------------------------ sizes and devices
def test_auto_size_is_the_small_model_on_the_cpu():
    for task in (digits.make_task(), ampkit.load_task("digits", device="cpu")):
        assert task.extra["size"] == "small" and task.samples_per_batch == 64
        assert task.model.fc1.out_features == 128 and len(task.model.hidden) == 0
        assert "small CNN" in task.description and task.batch(0)[0].device.type == "cpu"


def test_an_accelerator_gets_the_large_model_with_its_images_on_the_device():
    # The meta device stands in for an accelerator: shapes and placement without a GPU.
    task = ampkit.load_task("digits", seed=0, device="meta")
    cfg = digits.SIZES["large"]
    assert task.extra["size"] == "large" and task.samples_per_batch == cfg["batch_size"]
    assert task.model.fc1.out_features == cfg["hidden"] and len(task.model.hidden) == cfg["layers"] - 1
    x, y = task.batch(3)
    assert x.device.type == y.device.type == "meta"  # gathered there: a step copies no images
    assert x.shape == (cfg["batch_size"], 1, 8, 8) and y.shape == (cfg["batch_size"],)
    assert task.lr == cfg["lr"] and "large CNN" in task.description


def test_large_batches_are_the_same_images_as_on_the_host():
    # The device only changes where the images are gathered, not which: same seed, same batch.
    host = digits.make_task(seed=2, size="large", hidden=8)
    on_device = digits.make_task(seed=2, size="large", hidden=8, device="meta")
    assert host.batch(5)[0].shape == on_device.batch(5)[0].shape
    x_train, y_train, _, _ = digits.load_split()
    n = len(y_train)
    labels = host.batch(0)[1]  # 2048 > 1438: all of epoch 0, then the start of epoch 1
    assert torch.equal(labels[:n].sort().values, y_train.sort().values)


def test_options_override_the_size_and_flops_follow_the_layers():
    task = digits.make_task(size="large", hidden=32, layers=3, channels=4, batch_size=8)
    m = task.model
    assert m.conv.out_channels == 4 and m.fc1.out_features == 32 and len(m.hidden) == 2
    out = m(task.batch(0)[0])
    assert out.shape == (8, 10)
    macs = 8 * 8 * 4 * 9 + 4 * 16 * 32 + 2 * 32 * 32 + 32 * 10  # conv (8x8 outputs), fc1, 2 hidden, fc2
    assert task.flops_per_step == 3 * 2 * macs * 8


@pytest.mark.parametrize("options, needle", [({"size": "huge"}, "size='huge'"),
                                             ({"hidden": 0}, "hidden=0"),
                                             ({"layers": -1}, "layers=-1")])
def test_bad_size_options_are_one_line_errors(options, needle):
    with pytest.raises(ampkit.UsageError, match=needle):
        ampkit.load_task("digits", options=options)


def test_load_task_passes_the_device_only_to_factories_that_take_one():
    seen = {}

    def with_device(seed=0, device=None):
        seen["device"] = device
        return digits.make_task(seed=seed)

    def without(seed=0, **options):  # **options must not receive a device it never asked for
        seen["options"] = options
        return digits.make_task(seed=seed)

    ampkit.load_task(with_device, device="meta")
    assert seen["device"] == torch.device("meta")
    ampkit.load_task(without, device="meta")
    assert seen["options"] == {}
    ampkit.load_task(with_device, device="meta", options={"device": "cpu"})  # an explicit option wins
    assert seen["device"] == "cpu"

    def string_default(seed=0, device: str = "cpu"):  # a factory written for --task-arg device=cuda
        seen["string"] = device
        return digits.make_task(seed=seed)

    ampkit.load_task(string_default, device="meta")
    assert seen["string"] == "meta"  # its own type, not a torch.device its code never expected
