"""Clean twin of zero_grad_after_backward.py: `optimizer.zero_grad()` runs at the top of the iteration,
before the forward and the backward. Diagnose must say nothing.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def log(step, loss):
    if step % 10 == 0:
        pass


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        images = torch.randn(16, 3, 16, 16, generator=g)
        labels = torch.randint(0, 10, (16,), generator=g)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        log(step, loss)
        scaler.step(optimizer)
        scaler.update()
