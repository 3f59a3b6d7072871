"""Clean twin of host_sync.py: losses stay on the device and are read once at the end."""
import sys

import torch
import torch.nn as nn

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(dev)
x, y = torch.randn(32, 16, device=dev), torch.randn(32, 4, device=dev)
losses = []
for step in range(6):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    losses.append(loss.detach())
print(f"last loss {torch.stack(losses)[-1].item():.4f}")
