"""An Accelerate script: Accelerator(mixed_precision="bf16", cpu=True), accelerator.backward, set_seed."""

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

accelerator = Accelerator(mixed_precision="bf16", cpu=True)
set_seed(3)
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).long()
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
model.eval()
with torch.no_grad():
    acc = (model(x).argmax(1) == y).float().mean().item()
accelerator.print(f"train accuracy {acc:.4f}")
