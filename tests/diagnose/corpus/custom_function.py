"""A custom autograd Function (a hand-written 'safe' norm) inside a model, BF16 autocast.
Planted: the backward of the norm divides by the norm itself, inf at an all-zero row (nonfinite-backward)."""
import torch
import torch.nn as nn


class RowNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = x.norm(dim=-1, keepdim=True)
        ctx.save_for_backward(x, n)
        return n

    @staticmethod
    def backward(ctx, grad):
        x, n = ctx.saved_tensors
        return grad * x / n  # planted: no eps, 0/0 at a zero row


class Features(nn.Module):
    def forward(self, x):
        return torch.cat([x, RowNorm.apply(x)], dim=-1)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16, bias=False), Features(), nn.Linear(17, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x, y = torch.randn(16, 8), torch.randn(16, 1)
x[3] = 0.0  # padding
for step in range(4):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    loss = nn.functional.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
