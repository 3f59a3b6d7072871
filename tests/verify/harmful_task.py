"""A planted harmful task for `ampkit compare`: its first layer's activations exceed the FP16 range.

``big`` sees inputs scaled by 1e5, so its outputs are around 1e5: fine in FP32 and BF16 (same exponent
range), but above FP16's maximum of 65504, so under FP16 autocast they become inf and the LayerNorm
after it turns them into NaN. In FP32 the LayerNorm brings them back to unit scale and the task learns.
"""

import torch
from torch import nn

import ampkit

SCALE = 1e5


class Overflow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(10, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.big(x * SCALE))))


def make_task(seed: int = 0) -> ampkit.Task:
    g = torch.Generator().manual_seed(4321)
    x = torch.randn(512, 10, generator=g)
    y = (x[:, :5].sum(1) > x[:, 5:].sum(1)).long()
    model = Overflow()

    def batch(step):
        i = torch.randint(0, 384, (32,), generator=torch.Generator().manual_seed(seed * 100003 + step))
        return x[i], y[i]

    def loss(model, b):
        return nn.functional.cross_entropy(model(b[0]), b[1])

    def evaluate(model, device):
        pred = model(x[384:].to(device)).argmax(1).cpu()
        return {"accuracy": (pred == y[384:]).float().mean().item()}

    return ampkit.Task(name="overflow", model=model, batch=batch, loss=loss, evaluate=evaluate, metric="accuracy",
                       samples_per_batch=32, lr=1e-2, default_steps=40)
