"""Clean twin of nan_backward.py."""
import torch
import torch.nn as nn


class Magnitude(nn.Module):
    def forward(self, h):
        return torch.sqrt(h * h + 1e-6)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), Magnitude(), nn.Linear(16, 1))
nn.init.zeros_(model[0].bias)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x, y = torch.randn(16, 8), torch.randn(16, 1)
x[0] = 0.0  # a padding row
for step in range(4):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
