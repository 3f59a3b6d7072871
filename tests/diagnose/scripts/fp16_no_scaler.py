"""Planted: fp16-without-scaler. A small loss under FP16 autocast and no GradScaler: gradients flush to zero."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 16), torch.randn(64, 4)
for step in range(4):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y) * 1e-5  # e.g. normalised by a large token count
    loss.backward()  # planted defect: no scaler.scale(loss)
    opt.step()
