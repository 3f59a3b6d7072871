"""Clean twin of overflow_absorbed: the same normalisation written so that no intermediate value
can overflow FP16 (the scale is applied after the mean square)."""
import torch
import torch.nn as nn

torch.manual_seed(0)


class HandNorm(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6)


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
