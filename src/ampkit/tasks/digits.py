"""``digits``: scikit-learn's 8x8 handwritten digits with a small CNN.

On the CPU, small enough to train to >= 95 % test accuracy in seconds on a laptop, yet it runs Conv2d
and Linear layers, so autocast has real work to cast. On an accelerator the model is wider (``size``),
so that a comparison of precisions measures matmuls rather than kernel launches. The data ships
with scikit-learn: no download.

>>> import ampkit
>>> task = ampkit.load_task("digits", seed=1)
>>> x, y = task.batch(0)
>>> x.shape, y.shape
(torch.Size([64, 1, 8, 8]), torch.Size([64]))
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ampkit.tasks import Task

__all__ = ["make_task", "DigitsCNN", "load_split"]

TEST_FRACTION = 0.2
SPLIT_SEED = 20240531  # fixes which images are test images; never the task seed


@functools.lru_cache(maxsize=1)
def _load_arrays() -> tuple[np.ndarray, np.ndarray]:
    # Imported here so that importing ampkit.tasks does not pay for scikit-learn.
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.images.astype(np.float32), data.target.astype(np.int64)


def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)``; images are ``(N, 1, 8, 8)`` float32 in [0, 1].

    The split is fixed and does not depend on the task seed, so every seed, and every precision, is
    judged on the same 20 % of the images. It is drawn once from a constant generator rather than
    taken from the end of the file: the file is ordered by writer, and its last writers are hard
    enough that a test set made of them alone leaves no margin above the 95 % target.
    """
    images, labels = _load_arrays()
    # Pixel values are counts 0..16; fresh tensors so a caller cannot corrupt the cached arrays.
    x = torch.tensor(images).div_(16.0).unsqueeze(1)
    y = torch.tensor(labels)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = int(len(y) * TEST_FRACTION)
    train, test = perm[:-n_test].sort().values, perm[-n_test:].sort().values
    return x[train], y[train], x[test], y[test]


class DigitsCNN(nn.Module):
    """A 3x3 convolution, a 2x2 max-pool, ``layers`` hidden Linear layers and the 10-way classifier.

    One convolution, not a deeper stack, because PyTorch's CPU kernel for the FP16 weight gradient
    of a convolution is a slow fallback (about 150 MFLOP/s here): a second 16->32 convolution made an
    FP16 run of this task take 40 s instead of a few. One Conv2d is enough to put a convolution
    under autocast; the Linear layers carry most of the FLOPs.
    """

    def __init__(self, hidden: int = 128, channels: int = 16, layers: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.fc1 = nn.Linear(channels * 4 * 4, hidden)
        # Empty for the small model, so its parameters (and the RNG draws that make them) are unchanged.
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers - 1))
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)  # 8x8 -> 4x4
        x = F.relu(self.fc1(x.flatten(1)))
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.fc2(x)


def _forward_flops(model: DigitsCNN, batch_size: int) -> float:
    """Multiply-add FLOPs (2 per MAC) of the convolution and Linear layers for one batch."""
    per_sample = 2 * 8 * 8 * model.conv.weight.numel()  # padding=1 keeps 8x8 outputs
    for fc in (model.fc1, *model.hidden, model.fc2):
        per_sample += 2 * fc.weight.numel()
    return float(per_sample * batch_size)


# What "size" sets; explicit options override it. "small" trains in seconds on a laptop CPU. "large" is
# what an accelerator gets by default: the small model's step is a few dozen kernels of microseconds
# each, so on a GPU it measures kernel launches, and autocast's casts make AMP look slower than FP32.
# The large model's matmuls set the pace, which is what a comparison of precisions has to measure; on
# one H200 its FP32 step takes about 6 ms, longer than the host needs to launch an eager AMP step, so
# AMP pays off with eager steps too (BENCHMARKS.md, "digits sizes"). A batch is larger than the
# 1,438 training images: it spans two epochs' orders (an image may appear twice in it).
SIZES: dict[str, dict[str, Any]] = {
    "small": {"batch_size": 64, "hidden": 128, "channels": 16, "layers": 1, "lr": 3e-3},
    "large": {"batch_size": 2048, "hidden": 4096, "channels": 64, "layers": 2, "lr": 1e-3},
}


def _size_for(size: str, device: torch.device | None) -> str:
    if size == "auto":
        return "large" if device is not None and device.type != "cpu" else "small"
    if size not in SIZES:
        raise ValueError(f"size={size!r}: use auto, {', '.join(SIZES)}")
    return size


def make_task(seed: int = 0, size: str = "auto", batch_size: int | None = None, hidden: int | None = None,
              channels: int | None = None, layers: int | None = None,
              device: torch.device | str | None = None) -> Task:
    """Build the digits task; initial weights come from the global RNG that ``load_task`` seeds.

    ``size``: ``small`` (the CPU model), ``large`` (wide enough that the matmuls, not kernel launches,
    set the pace on an accelerator) or ``auto`` (``large`` on an accelerator, ``small`` on the CPU);
    ``batch_size``, ``hidden``, ``channels`` and ``layers`` override the size's values. ``device``
    (passed by ampkit: the run's device) also keeps the images there, so a step copies nothing from the host.
    """
    dev = torch.device(device) if device is not None else None
    name = _size_for(size, dev)
    given = {"batch_size": batch_size, "hidden": hidden, "channels": channels, "layers": layers}
    cfg = {**SIZES[name], **{k: v for k, v in given.items() if v is not None}}
    bad = [f"{k}={cfg[k]!r}" for k in given if not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: batch_size, hidden, channels and layers must be positive integers")
    batch_size = cfg["batch_size"]
    x_train, y_train, x_test, y_test = load_split()
    n_train = len(y_train)
    model = DigitsCNN(hidden=cfg["hidden"], channels=cfg["channels"], layers=cfg["layers"])
    on_device = dev is not None and dev.type != "cpu"
    if on_device:  # 1438 images of 8x8: a few hundred KB, gathered on the device each step
        x_train, y_train = x_train.to(dev), y_train.to(dev)

    @functools.lru_cache(maxsize=4)  # a batch of 2048 spans up to three epochs of 1438 images
    def order(epoch: int) -> torch.Tensor:
        # A fresh generator per epoch keeps batch(step) a pure function of (seed, step): resuming at
        # any step, or running FP32 and AMP side by side, sees exactly the same images.
        return torch.randperm(n_train, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(step * batch_size, (step + 1) * batch_size)
        epochs = pos // n_train
        idx = torch.empty_like(pos)
        # A batch may straddle an epoch boundary (or span several if batch_size > n_train).
        for epoch in epochs.unique().tolist():
            sel = epochs == epoch
            idx[sel] = order(epoch)[pos[sel] % n_train]
        if on_device:
            idx = idx.to(dev, non_blocking=True)
        return x_train[idx], y_train[idx]

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(b[0]), b[1])

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        logits = model(x_test.to(device)).float()
        target = y_test.to(device)
        return {
            "accuracy": (logits.argmax(1) == target).float().mean().item(),
            "loss": F.cross_entropy(logits, target).item(),
        }

    shape = (f"1 conv + {cfg['layers'] + 1} linear, {cfg['channels']} channels, hidden={cfg['hidden']}, "
             f"batch {batch_size}")
    return Task(
        name="digits",
        model=model,
        batch=batch,
        loss=loss,
        evaluate=evaluate,
        metric="accuracy",
        higher_is_better=True,
        samples_per_batch=batch_size,
        lr=cfg["lr"],
        weight_decay=0.01,
        default_steps=300,
        cpu_threads=1,  # a model this small gains nothing from a second thread; a busy CPU's waiting threads cost 7x
        flops_per_step=3 * _forward_flops(model, batch_size),
        description=(f"scikit-learn 8x8 digits ({n_train} train / {len(y_test)} test images), "
                     f"{name} CNN ({shape}), cross-entropy; metric: test accuracy"),
        extra={"n_train": n_train, "n_test": len(y_test), "size": name, **{k: cfg[k] for k in given}},
    )
