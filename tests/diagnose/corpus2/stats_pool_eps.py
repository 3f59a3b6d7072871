"""An x-vector style speaker classifier: frame-level 1-D convolutions, then statistics pooling (mean and
standard deviation over time), FP16 autocast with a GradScaler.

Planted: the pooling's std is `sqrt(var + 1e-12)`. In FP16 the eps rounds to 0; a silent clip (all-zero
features) has variance 0, sqrt(0) is fine in the forward, but its derivative 1 / (2 * sqrt(0)) is inf,
so the backward turns finite gradients into NaN.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class StatsPool(nn.Module):
    def __init__(self, eps=1e-12):
        super().__init__()
        self.eps = eps

    def forward(self, x):  # x: (batch, channels, time)
        mean = x.mean(dim=-1)
        var = x.var(dim=-1, unbiased=False)
        std = torch.sqrt(var + self.eps)  # expect: nonfinite-backward
        return torch.cat([mean, std], dim=-1)


class XVector(nn.Module):
    def __init__(self, n_mels=12, channels=32, n_speakers=5):
        super().__init__()
        self.frames = nn.Sequential(
            nn.Conv1d(n_mels, channels, 3, padding=1, bias=False), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1, bias=False), nn.ReLU())
        self.pool = StatsPool()
        self.embed = nn.Linear(2 * channels, 32)
        self.classify = nn.Linear(32, n_speakers)

    def forward(self, feats):
        return self.classify(F.relu(self.embed(self.pool(self.frames(feats)))))


def fake_batch(g, batch=8, n_mels=12, frames=40):
    feats = torch.randn(batch, n_mels, frames, generator=g).abs()
    feats[0] = 0.0  # a silent clip
    return feats, torch.randint(0, 5, (batch,), generator=g)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = XVector()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(args.steps):
        feats, spk = fake_batch(g)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(feats).float(), spk)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
