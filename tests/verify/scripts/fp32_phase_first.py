"""As the PyTorch AMP recipe runs: a first loop in default precision (FP32), then the same training under autocast.

python fp32_phase_first.py [--fp32-steps N] [--amp-steps N] [--no-amp]
"""

import argparse
from contextlib import nullcontext

import torch
from sklearn.datasets import load_digits
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fp32-steps", type=int, default=3)
parser.add_argument("--amp-steps", type=int, default=3)
parser.add_argument("--no-amp", action="store_true", help="nanoGPT's CPU path: ctx = nullcontext()")
args = parser.parse_args()

torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data[:256], dtype=torch.float32) / 16.0
y = torch.tensor(digits.target[:256])
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step(ctx):
    idx = torch.randint(0, len(x), (32,))
    with ctx:
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


for _ in range(args.fp32_steps):  # default precision first
    step(nullcontext())
for _ in range(args.amp_steps):
    loss = step(nullcontext() if args.no_amp else torch.autocast("cpu", dtype=torch.bfloat16))
print(f"loss {loss.item():.4f}")
