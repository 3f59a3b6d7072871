"""A planted absorbed FP16 overflow for `compare --explain`: a hand-written normalisation in a digits MLP.

``HandNorm`` computes ``x / sqrt(mean((300 * x) ** 2))``: in FP32 that is a plain RMS normalisation (the
gain of 300 undoes the factor), but under FP16 autocast its input is FP16 (it comes from a Linear),
``(300 * x) ** 2`` exceeds 65504 for ``|x| > 0.85``, the mean becomes inf and ``x / inf = 0``. The
module's output is finite (zeros), so the loss stays finite and the scaler never skips: the run is
silently wrong. ``--fp32-modules norm`` fixes it. Loaded as ``tests/verify/overflow_norm_task.py:make_task``.
"""

import torch
import torch.nn.functional as F
from torch import nn

import ampkit
from ampkit.tasks.digits import load_split


class HandNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.full((dim,), 300.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * x / torch.sqrt(((300 * x) ** 2).mean(-1, keepdim=True) + 1e-6)


class NormMLP(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.norm = HandNorm(hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.norm(self.fc1(x.flatten(1)))))


def make_task(seed: int = 0, hidden: int = 64) -> ampkit.Task:
    x_train, y_train, x_test, y_test = load_split()
    x_train, x_test = x_train * 4, x_test * 4  # pixel values 0..4: fc1's outputs leave FP16's safe range for 300x
    model = NormMLP(hidden)

    def batch(step):
        i = torch.randint(0, len(y_train), (64,), generator=torch.Generator().manual_seed(seed * 100003 + step))
        return x_train[i], y_train[i]

    def loss(model, b):
        return F.cross_entropy(model(b[0]), b[1])

    def evaluate(model, device):
        pred = model(x_test.to(device)).argmax(1).cpu()
        return {"accuracy": (pred == y_test).float().mean().item()}

    return ampkit.Task(name="overflow-norm", model=model, batch=batch, loss=loss, evaluate=evaluate,
                       metric="accuracy", samples_per_batch=64, lr=1e-2, default_steps=40)
