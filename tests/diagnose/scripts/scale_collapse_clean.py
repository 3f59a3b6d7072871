"""Clean twin of scale_collapse.py."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
x, y = torch.randn(32, 16), torch.randn(32, 4)
for step in range(24):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = nn.functional.mse_loss(out.float(), y, reduction="sum")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
