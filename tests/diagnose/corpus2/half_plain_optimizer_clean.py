"""Training an MNIST-sized MLP in FP16 the way torch's AMP recipe does it.

Clean twin of half_plain_optimizer.py: FP32 weights, the forward under FP16 autocast, a GradScaler.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=64, hidden=128, n_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


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
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in batches(args.steps):
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
