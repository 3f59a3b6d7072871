"""A script that crashes before training (its own error line is shown)."""

import torch

model = torch.nn.Linear(4, 4)
raise ValueError("data file train.csv is missing")
