"""A small VAE: sigmoid decoder, reconstruction by F.binary_cross_entropy inside the autocast region.
Planted: bce-under-autocast (CUDA/MUSA autocast refuse it; CPU autocast quietly runs it in FP32)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class VAE(nn.Module):
    def __init__(self, d_in=64, d_z=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU())
        self.mu, self.logvar = nn.Linear(64, d_z), nn.Linear(64, d_z)
        self.dec = nn.Sequential(nn.Linear(d_z, 64), nn.ReLU(), nn.Linear(64, d_in), nn.Sigmoid())

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def loss_function(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")  # planted
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / x.size(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="VAE")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.rand(256, 64).round()
    for step in range(args.steps):
        x = data[step * 32:(step + 1) * 32]
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            recon, mu, logvar = model(x)
            loss = loss_function(recon, x, mu, logvar)
        loss.backward()
        optimizer.step()
