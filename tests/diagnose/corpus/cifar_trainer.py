"""Image classifier with a Trainer class, argparse, DataLoader workers, FP16 + GradScaler.
Planted: gradients clipped before scaler.unscale_ (clip-before-unscale)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from common.data import SyntheticImages, accuracy, seed_everything


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1, stride=2), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 2))


class Trainer:
    def __init__(self, args):
        self.args = args
        self.device = torch.device("cpu")
        self.model = build_model(args.width).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=args.amp)
        self.criterion = nn.CrossEntropyLoss()

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.args.amp):
            logits = self.model(x)
            loss = self.criterion(logits.float(), y)
        self.scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)  # planted: before unscale_
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach(), accuracy(logits.detach(), y)

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                self.train_step(x.to(self.device), y.to(self.device))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    args = parser.parse_args()
    seed_everything(0)
    loader = DataLoader(SyntheticImages(), batch_size=32, shuffle=True, num_workers=args.workers)
    Trainer(args).fit(loader, args.epochs)


if __name__ == "__main__":
    main()
