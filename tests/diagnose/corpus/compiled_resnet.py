"""A residual MLP compiled with torch.compile (backend from the command line), FP16 autocast, GradScaler.
Planted: one block's first layer has weights 1e4x too large, so its FP16 output overflows
(nonfinite-forward, named inside the compiled model without `_orig_mod.`)."""
import argparse

import torch
import torch.nn as nn


class ResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="eager")  # CI: no C++ compiler time; real runs: inductor
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(ResBlock(16), ResBlock(16), nn.Linear(16, 2))
    with torch.no_grad():
        model[1].fc1.weight.mul_(1e4)  # planted
    compiled = torch.compile(model, backend=args.backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(args.steps):
        x, y = torch.randn(32, 16) * 4, torch.randint(0, 2, (32,))
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(compiled(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
