"""Clean twin of rmsnorm_lm: the same hand-written RMSNorm squares x itself (no pre-scale), which stays in
FP16's range."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from common.data import SyntheticTokens


class RMSNorm(nn.Module):
    def __init__(self, d, prescale=256.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.prescale = prescale

    def forward(self, x):
        return self.weight * x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6)


class MLPBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.norm = RMSNorm(4 * d)

    def forward(self, x):
        return x + self.down(self.norm(torch.relu(self.up(x))))


class LM(nn.Module):
    def __init__(self, vocab=64, d=48, n=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.Sequential(*(MLPBlock(d) for _ in range(n)))
        self.out = nn.Linear(d, vocab)

    def forward(self, idx):
        return self.out(self.layers(self.emb(idx)))


def train(model, loader, opt, scaler, epochs):
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(x)
            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    lm = LM()
    train(lm, DataLoader(SyntheticTokens(), batch_size=16), torch.optim.Adam(lm.parameters(), 1e-3),
          torch.amp.GradScaler("cpu"), a.epochs)
