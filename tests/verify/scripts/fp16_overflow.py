"""A real FP16 defect: the first layer sees inputs scaled by 1e5, so its outputs (~1e5) overflow FP16 (max 65504)
under FP16 autocast; in FP32 the LayerNorm brings them back and the model learns. With a GradScaler every
step's gradients are inf: the scaler skips them all."""

import torch
from torch import nn

torch.manual_seed(0)
g = torch.Generator().manual_seed(4321)
x = torch.randn(512, 10, generator=g)
y = (x[:, :5].sum(1) > x[:, 5:].sum(1)).long()
model = nn.Sequential(nn.Linear(10, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu")
for step in range(30):
    i = torch.randint(0, 512, (32,))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x[i] * 1e5), y[i])
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print("done")
