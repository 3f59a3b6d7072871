"""Fine-tuning a small text classifier with gradient accumulation ("effective batch 32 on a small
card"), FP16 autocast with a GradScaler, as many forum answers write it.

Planted: the loss is not divided by the accumulation count and `scaler.step` / `scaler.update` run at
every micro-batch; only `zero_grad` waits for the accumulation boundary. Each update applies a growing
partial sum of undivided gradients.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class BagOfWords(nn.Module):
    def __init__(self, vocab=200, d=32, n_classes=3):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, d, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, ids):
        return self.mlp(self.emb(ids))


def dataset(n=96, T=12, vocab=200):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, T), generator=g)
    return TensorDataset(ids, (ids[:, 0] % 3))


def train(accum_steps, max_steps):
    torch.manual_seed(0)
    model = BagOfWords()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(dataset(), batch_size=8, shuffle=True)
    opt.zero_grad()
    for i, (ids, labels) in enumerate(loader):
        if i >= max_steps * accum_steps:
            break
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(ids).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)  # expect: accumulation-steps-every-microbatch
        scaler.update()
        if (i + 1) % accum_steps == 0:
            opt.zero_grad()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum-steps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    train(args.accum_steps, args.steps)
