"""Clean: an image-classification recipe in the style of pytorch/vision's references/classification/train.py
(BSD-3-Clause): a small ResNet with BatchNorm, `scaler = GradScaler() if args.amp else None`, autocast
enabled by the scaler, unscale before `clip_grad_norm_`, label smoothing, SGD with nesterov momentum, a
linear warm-up chained with a cosine schedule stepped once per epoch; FP16.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import params_finite, report


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out)
        self.conv2, self.bn2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out)
        self.downsample = None if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


def resnet_tiny(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         BasicBlock(16, 16), BasicBlock(16, 32, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, num_classes))


def train_one_epoch(model, criterion, optimizer, data, args, scaler=None):
    model.train()
    for image, target in data:
        with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            if args.clip_grad_norm is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    return loss


def main(args):
    torch.manual_seed(0)
    model = resnet_tiny()
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4, nesterov=True)
    scaler = torch.amp.GradScaler("cpu") if args.amp else None
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs - 1)
    lr_scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[1])
    g = torch.Generator().manual_seed(0)
    for epoch in range(args.epochs):
        data = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)]
        loss = train_one_epoch(model, criterion, optimizer, data, args, scaler)
        lr_scheduler.step()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--clip-grad-norm", type=float, default=1.0)
    parser.add_argument("--amp", action="store_true", default=True)
    main(parser.parse_args())
