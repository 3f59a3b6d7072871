"""Clean twin of static_loss_scale.py: the static loss scale is replaced by a GradScaler, which skips an
overflowing step and lowers its scale. Diagnose must say nothing.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F



class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def train_step(model, opt, scaler, x, y):
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x)
    loss = F.mse_loss(pred.float(), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss.detach()


if __name__ == "__main__":
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.randn(32, 16, generator=g) * 4
        y = (x.sum(dim=1, keepdim=True) * 10)
        train_step(model, opt, scaler, x, y)
