"""An MLP regressor from an old mixed-precision recipe: FP16 autocast and a hand-rolled static loss scale
(multiply the loss by a constant, divide the gradients by it after the backward), no GradScaler.

Planted: with S = 1e5 the backward's FP16 matmuls overflow to inf at the first step; nothing skips the
step, the weights become inf/NaN, and every later forward is NaN.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

LOSS_SCALE = 1e5


class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def train_step(model, opt, x, y):
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x)
    loss = F.mse_loss(pred.float(), y)
    opt.zero_grad()
    scaled = loss * LOSS_SCALE  # expect: static-loss-scale
    scaled.backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(LOSS_SCALE)
    opt.step()
    return loss.detach()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.randn(32, 16, generator=g) * 4
        y = (x.sum(dim=1, keepdim=True) * 10)
        train_step(model, opt, x, y)
