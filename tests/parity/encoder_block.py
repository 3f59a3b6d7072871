"""torch's own transformer encoder layer (attention, layer norm, GELU MLP), trained under CPU autocast."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[1] if len(sys.argv) > 1 else "bf16"]
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, activation="gelu",
                                   batch_first=True, norm_first=True)
model = nn.Sequential(layer, nn.LayerNorm(64), nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
for step in range(2):
    x, y = torch.randn(8, 12, 64), torch.randint(0, 10, (8, 12))
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    loss = F.cross_entropy(out.float().flatten(0, 1), y.flatten())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
