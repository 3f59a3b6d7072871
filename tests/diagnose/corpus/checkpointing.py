"""Training with periodic checkpoints (argparse, a save_checkpoint helper, FP16 + GradScaler).
Planted: the checkpoint has model and optimizer but not the scaler (scaler-not-checkpointed)."""
import argparse
import os
import tempfile

import torch
import torch.nn as nn


def save_checkpoint(path, model, optimizer, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)  # planted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="ckpt-"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--save-every", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(1, args.steps + 1):
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % args.save_every == 0:
            save_checkpoint(os.path.join(args.out, f"step{step}.pt"), model, optimizer, step)


if __name__ == "__main__":
    main()
