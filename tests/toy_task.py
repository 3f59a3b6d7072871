"""A small user task, loaded by tests as ``tests/toy_task.py:make_task`` (the factory protocol)."""

import torch
from torch import nn

import ampkit


def make_task(seed: int = 0, hidden: int = 32, dropout: float = 0.1):
    g = torch.Generator().manual_seed(1234)  # the data does not depend on the seed
    x = torch.randn(512, 10, generator=g)
    y = (x[:, :5].sum(1) > x[:, 5:].sum(1)).long()
    model = nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 2))

    def batch(step):
        i = torch.randint(0, 384, (32,), generator=torch.Generator().manual_seed(seed * 100003 + step))
        return x[i], y[i]

    def loss(model, b):
        return nn.functional.cross_entropy(model(b[0]), b[1])

    def evaluate(model, device):
        pred = model(x[384:].to(device)).argmax(1).cpu()
        return {"accuracy": (pred == y[384:]).float().mean().item()}

    return ampkit.Task(name="toy", model=model, batch=batch, loss=loss, evaluate=evaluate, metric="accuracy",
                       samples_per_batch=32, lr=1e-2, default_steps=40)
