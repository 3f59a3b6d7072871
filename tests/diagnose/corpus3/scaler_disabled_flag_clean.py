"""A GPT-style fine-tuning script that picks its dtype from a flag and builds the GradScaler from the same
flag, FP16 on cards without BF16. A regression model trained on small targets, averaged over a large batch.

Clean twin of scaler_disabled_flag.py: the scaler is enabled for FP16 (`enabled=not is_bf16`) and scales
the loss above FP16's normal range. Diagnose must say nothing.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Regressor(nn.Module):
    def __init__(self, d_in=32, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def make_scaler(dtype_name):
    is_bf16 = dtype_name == "bfloat16"
    return torch.amp.GradScaler("cpu", enabled=not is_bf16)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(args.dtype)
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        x = torch.randn(512, 32, generator=g)
        y = 1e-3 * x[:, :1]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            pred = model(x)
        loss = F.mse_loss(pred.float(), y) * 1e-3
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
