"""A small GAN: two models, two optimizers, one GradScaler used correctly for both (unscale_ per
optimizer before clipping, one update per iteration), FP16 autocast. Clean."""
import torch
import torch.nn as nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16))
D = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
scaler = torch.amp.GradScaler("cpu")
bce = nn.BCEWithLogitsLoss()
real_data = torch.randn(512, 16) * 0.5 + 1.0

for i in range(8):
    real = real_data[i * 32:(i + 1) * 32]
    z = torch.randn(32, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        fake = G(z)
        d_loss = bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
    opt_d.zero_grad(set_to_none=True)
    scaler.scale(d_loss).backward()
    scaler.unscale_(opt_d)
    nn.utils.clip_grad_norm_(D.parameters(), 5.0)
    scaler.step(opt_d)
    with torch.autocast("cpu", dtype=torch.float16):
        g_loss = bce(D(fake), torch.ones(32, 1))
    opt_g.zero_grad(set_to_none=True)
    scaler.scale(g_loss).backward()
    scaler.step(opt_g)
    scaler.update()
