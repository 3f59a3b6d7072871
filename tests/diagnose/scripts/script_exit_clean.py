"""Clean twin of script_exit: sys.exit(0) is a normal end."""
import sys

import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4)).sum().backward()
opt.step()
sys.exit(0)
