"""A Lightning Fabric script: bf16-mixed on the CPU, seed_everything, fabric.backward / optimizer.step."""

import sys

import torch
from lightning.fabric import Fabric, seed_everything
from torch import nn

precision = sys.argv[1] if len(sys.argv) > 1 else "bf16-mixed"
fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
seed_everything(7)
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).long()
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Dropout(0.1), nn.Linear(64, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                                              shuffle=True))
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        fabric.backward(loss)
        optimizer.step()
    fabric.print(f"epoch {epoch} loss {loss.item():.4f}")
