"""Clean twin of checkpointing: training with periodic checkpoints (argparse, a save_checkpoint helper, FP16 + GradScaler).
Clean: the checkpoint carries the scaler state too."""
import argparse
import os
import tempfile

import torch
import torch.nn as nn


def save_checkpoint(path, model, optimizer, scaler, step):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "step": step}, path)


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
            save_checkpoint(os.path.join(args.out, f"step{step}.pt"), model, optimizer, scaler, step)


if __name__ == "__main__":
    main()
