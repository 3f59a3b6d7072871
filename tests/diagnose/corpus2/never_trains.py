"""An evaluation entry point: builds the model, loads no checkpoint (none given), runs the test set in
FP32 under no_grad and prints the accuracy. It never takes an optimizer step and never enters autocast:
diagnose has nothing to check (exit 3, "nothing was checked").
"""
import argparse

import torch
import torch.nn as nn


def evaluate(model, batches):
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return correct / max(total, 1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, weights_only=True))
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
    print(f"accuracy {evaluate(model.eval(), data):.3f}")
