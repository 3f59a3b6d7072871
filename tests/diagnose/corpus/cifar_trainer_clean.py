"""Clean twin of cifar_trainer: unscale_ before clipping, as the AMP recipe says."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from common.data import SyntheticImages, seed_everything


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(4, width), nn.SiLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.GroupNorm(4, width), nn.SiLU())
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    seed_everything(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(SyntheticImages(), batch_size=32, num_workers=2)
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()


if __name__ == "__main__":
    main()
