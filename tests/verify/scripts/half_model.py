"""Low precision that does not come from autocast: the model is cast with .half() (refused)."""

import torch
from torch import nn

model = nn.Linear(8, 2).half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(4, 8).half()).float().sum()
loss.backward()
optimizer.step()
