"""A CNN classifier on random images, FP16 autocast with a GradScaler; the loop was reordered when logging
was added, and `optimizer.zero_grad()` ended up between the backward and the step.

Planted: the gradients the backward produced are cleared (set to None) before `scaler.step`: the step sees
no gradients, nothing is learned, and torch's scaler fails with "No inf checks were recorded".
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
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        log(step, loss)
        optimizer.zero_grad()  # expect: zero-grad-between-backward-and-step
        scaler.step(optimizer)
        scaler.update()
