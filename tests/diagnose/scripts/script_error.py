"""Raises a device error (as a CUDA/MUSA run would report it) after one step."""
import torch
import torch.nn as nn

model = nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4)).sum().backward()
opt.step()
raise RuntimeError("CUDA error: device-side assert triggered")
