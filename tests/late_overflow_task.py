"""A task that goes bad late, loaded by the replay tests as ``tests/late_overflow_task.py:make_task``.

From micro-batch ``shift_at`` on, the data changes:
* ``mode="overflow"``: the inputs grow 300x. ``mix`` (unscaled attention scores, ``h @ h^T``) then exceeds
  FP16's largest value (65504) in every batch, while FP32 stays finite, and the LayerNorm after it keeps
  the rest of the model at its usual scale: a precision failure of one module.
* ``mode="data"``: one input value is NaN: a data failure that no precision fixes.
"""

import torch
from torch import nn

import ampkit


class Scores(nn.Module):
    """Self-attention weights without the 1/sqrt(d) scaling: fine for unit-scale inputs."""

    def forward(self, h):
        s = h @ h.transpose(-1, -2)  # OVERFLOW LINE: |h|^2 * d exceeds 65504 in FP16 for large h
        return torch.softmax(s, dim=-1) @ h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.mix = Scores()
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        h = self.fc1(x)
        h = self.norm(self.mix(h))  # MIX CALL
        return self.fc2(h.mean(1))


def make_task(seed: int = 0, shift_at: int = 30, mode: str = "overflow"):
    if mode not in ("overflow", "data"):
        raise ValueError(f"mode is overflow or data, got {mode!r}")
    g = torch.Generator().manual_seed(99)  # the data does not depend on the seed
    x = torch.randn(256, 4, 8, generator=g)
    y = (x.sum((1, 2)) > 0).long()

    def batch(step):
        i = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(seed * 100003 + step))
        xb = x[i].clone()
        if step >= shift_at:
            if mode == "overflow":
                xb = xb * 300.0
            else:
                xb[0, 0, 0] = float("nan")
        return xb, y[i]

    def loss(model, b):
        return nn.functional.cross_entropy(model(b[0]), b[1])

    return ampkit.Task(name="late-overflow", model=Net(), batch=batch, loss=loss, samples_per_batch=16, lr=1e-3,
                       default_steps=100)
