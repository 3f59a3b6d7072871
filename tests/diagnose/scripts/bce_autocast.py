"""Planted: bce-under-autocast. A sigmoid head and nn.BCELoss inside the autocast region (refused by CUDA/MUSA
autocast; CPU autocast quietly runs it in FP32)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
criterion = nn.BCELoss()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 16), (torch.rand(64, 1) > 0.5).float()
for step in range(4):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = criterion(model(x), y)  # planted defect
    loss.backward()
    opt.step()
