"""A plain PyTorch training loop, as a user writes it: autocast + GradScaler, its own seed, its own printout.

python plain_loop.py [--precision bf16|fp16] [--epochs N] [--seed S]
"""

import argparse
import random

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)

for epoch in range(args.epochs):
    model.train()
    perm = torch.randperm(len(train_x))
    for i in range(0, len(perm), 50):
        idx = perm[i:i + 50]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    print(f"epoch {epoch} loss {loss.item():.4f}")

model.eval()
with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
    acc = (model(test_x).argmax(1) == test_y).float().mean().item()
print(f"test accuracy {acc:.4f}")
