"""A DCGAN-style training loop on 2-D toy data (generator and discriminator MLPs), FP16 autocast, one
GradScaler for both networks.

Planted: `scaler.update()` runs after the discriminator's step and again after the generator's: the
one scaler is updated twice per iteration, so its scale moves twice as fast and an overflow in one
network's gradients lowers the scale for the other.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def ring(n, g):
    angle = torch.rand(n, generator=g) * 6.2832
    return torch.stack([angle.cos(), angle.sin()], dim=1) * 2 + 0.05 * torch.randn(n, 2, generator=g)


def main(iters=4, batch=64, z_dim=8):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    netG = nn.Sequential(nn.Linear(z_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    netD = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    scaler = torch.amp.GradScaler("cpu")
    ones, zeros = torch.ones(batch, 1), torch.zeros(batch, 1)
    for it in range(iters):
        real = ring(batch, g)
        noise = torch.randn(batch, z_dim, generator=g)
        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        optD.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            fake = netG(noise)
            errD = (F.binary_cross_entropy_with_logits(netD(real), ones)
                    + F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros))
        scaler.scale(errD).backward()
        scaler.step(optD)
        scaler.update()  # expect: scaler-updated-twice
        # (2) update G: maximize log(D(G(z)))
        optG.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            errG = F.binary_cross_entropy_with_logits(netD(fake), ones)
        scaler.scale(errG).backward()
        scaler.step(optG)
        scaler.update()


if __name__ == "__main__":
    main()
