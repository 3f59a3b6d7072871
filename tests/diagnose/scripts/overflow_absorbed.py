"""Planted: overflow-absorbed. A hand-written normalisation squares 300*x: in FP16 the square overflows to
inf, x / inf gives 0, the loss stays finite and the GradScaler never skips (issue 14)."""
import torch
import torch.nn as nn

torch.manual_seed(0)


class HandNorm(nn.Module):
    def forward(self, x):
        return x / torch.sqrt(torch.mean((300 * x) ** 2, dim=-1, keepdim=True)) * 300  # planted defect


model = nn.Sequential(nn.Linear(16, 64), HandNorm(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
x, y = torch.randn(64, 16), torch.randn(64, 1)
for step in range(5):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
