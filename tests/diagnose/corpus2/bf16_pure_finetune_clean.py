"""Fine-tuning a small classifier with BF16 mixed precision, the way torch's AMP recipe does it.

Clean twin of bf16_pure_finetune.py: the weights stay FP32 (the optimizer updates them exactly), the forward
runs under BF16 autocast; BF16 needs no GradScaler.
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
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    for x, y in batches(args.steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
