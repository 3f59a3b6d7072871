"""Planted: scaler-with-bf16. An enabled GradScaler under BF16 autocast."""
import torch
import torch.nn as nn

torch.manual_seed(0)
dtype = torch.bfloat16
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")  # planted defect
x, y = torch.randn(32, 16), torch.randn(32, 4)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
