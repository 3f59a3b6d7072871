"""Planted for --fp16-range: a hand-written attention block whose raw scores q @ k^T exceed FP16's range
before the 1/sqrt(d) scaling; the block's output stays small, so watching module outputs misses it."""
import math

import torch
import torch.nn as nn

torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.d = d

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2)  # planted defect: raw scores overflow FP16
        return self.o(torch.softmax(scores / math.sqrt(self.d), dim=-1) @ self.v(x))


class Net(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.attn = Attention(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        return self.head(self.attn(x)).mean(1)


model = Net()
with torch.no_grad():
    model.attn.q.weight.mul_(40.0)
    model.attn.k.weight.mul_(40.0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu")
x, y = torch.randn(4, 16, 32) * 3, torch.randn(4, 1)
for step in range(5):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
