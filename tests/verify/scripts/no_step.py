"""A script that never reaches an optimizer step (refused)."""

import torch

with torch.autocast("cpu", dtype=torch.bfloat16):
    print(torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum())
