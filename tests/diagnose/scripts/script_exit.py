"""Planted: script-exit. The script stops itself with sys.exit(3) after a step (not a script error)."""
import sys

import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4)).sum().backward()
opt.step()
if len(sys.argv) < 2:
    sys.exit(3)  # planted: "no config given"
