"""A regression model with gradient clipping, FP16 autocast with a GradScaler, refactored into a
`train_step` helper.

Planted: the refactor dropped `scaler.update()`. torch refuses the second iteration's
`scaler.unscale_(optimizer)` ("unscale_() has already been called on this optimizer since the last
update()"); without update() the scale would never adapt either.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model():
    return nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def train_step(model, opt, scaler, x, y, max_norm=1.0):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x)
    loss = F.mse_loss(pred.float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # expect: scaler-update-missing
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    return loss.detach()


def main(steps=4):
    torch.manual_seed(0)
    w_true = torch.randn(10, 1)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    for step in range(steps):
        x = torch.randn(32, 10)
        y = x @ w_true + 0.1 * torch.randn(32, 1)
        losses.append(train_step(model, opt, scaler, x, y))
    return torch.stack(losses)


if __name__ == "__main__":
    main()
