"""FP32 regression with a Dataset class, DataLoader workers, a scheduler and per-step logging with
.item() (on the CPU a plain read, not a device sync). Clean."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    history = []
    for x, y in DataLoader(Points(), batch_size=32, num_workers=2, shuffle=True):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        history.append(loss.item())
