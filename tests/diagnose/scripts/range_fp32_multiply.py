"""FP16 autocast with a GradScaler; the attention energies are computed from `.float()` scores and sharpened
by a large factor, so the multiply runs in FP32 under autocast too (its values reach ~1e5 and more, beyond FP16's
65504, but they are never FP16). Plain diagnose finds nothing; --fp16-range must not name model.attn."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-2, -1)
        energy = scores.float() * 1e5  # FP32 in the AMP run: no FP16 overflow
        return F.softmax(energy, dim=-1) @ x.float()


model = nn.Sequential(nn.Linear(16, 16), Attn(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
torch.manual_seed(0)
for step in range(3):
    x, y = torch.randn(8, 6, 16), torch.randn(8, 6, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = F.mse_loss(out.float(), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
