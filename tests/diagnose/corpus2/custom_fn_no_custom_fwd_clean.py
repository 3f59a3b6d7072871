"""A model with a hand-written fused "linear + GELU" autograd.Function (to save activation memory, as
some repos do), trained under BF16 autocast.

Clean twin of custom_fn_no_custom_fwd.py: forward and backward are decorated with
`torch.amp.custom_fwd` / `custom_bwd`, so the backward runs under the forward's autocast state.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearGELU(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, weight, bias):
        pre = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, pre)
        return F.gelu(pre)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out):
        x, weight, pre = ctx.saved_tensors
        with torch.enable_grad():
            p = pre.detach().requires_grad_(True)
            (g_pre,) = torch.autograd.grad(F.gelu(p), p, grad_out)
        grad_x = g_pre @ weight
        return grad_x, g_pre.t() @ x, g_pre.sum(0)


class FusedMLP(nn.Module):
    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(hidden, d) * d ** -0.5)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(LinearGELU.apply(x, self.w1, self.b1))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = FusedMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        x = torch.randn(32, 16)
        y = x.sum(1, keepdim=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
