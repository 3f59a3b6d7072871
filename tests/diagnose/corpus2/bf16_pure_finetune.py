"""Fine-tuning a small classifier "in BF16 to halve the memory", the way many fine-tuning scripts do:
the whole model is converted with `.to(torch.bfloat16)` and AdamW updates it at a fine-tuning learning rate.

Planted: the BF16 weights are the only copy the optimizer updates. An AdamW update of about lr = 1e-5 is far
below half a BF16 rounding step of a weight near 0.05 (about 1e-4), so most updates change nothing.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, d_in=64, hidden=128, n_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.out(F.gelu(self.norm(self.fc1(x))))


def batches(n, batch=32, d_in=64):
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        x = torch.rand(batch, d_in, generator=g)
        yield x, (x[:, :10].argmax(1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Classifier()
    model.to(torch.bfloat16)  # expect: bf16-weights-without-master
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    for x, y in batches(args.steps):
        logits = model(x.to(torch.bfloat16))
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
