"""A tiny denoising-diffusion trainer in the style of openai/improved-diffusion (MIT): an MLP denoiser
with a timestep embedding, MSE on the predicted noise, FP16 autocast.

Clean twin of static_loss_scale.py: the same start scale, held by a GradScaler, which skips the steps
whose gradients overflow and lowers the scale.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import params_finite, report

LOSS_SCALE = 2.0 ** 22


def timestep_embedding(t, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Denoiser(nn.Module):
    def __init__(self, d=16, hidden=128, t_dim=32):
        super().__init__()
        self.t_dim = t_dim
        self.time = nn.Sequential(nn.Linear(t_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.inp = nn.Linear(d, hidden)
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, d))

    def forward(self, x, t):
        return self.out(self.inp(x) + self.time(timestep_embedding(t, self.t_dim)))


def main():
    torch.manual_seed(0)
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=LOSS_SCALE)
    betas = torch.linspace(1e-4, 0.02, 1000)
    alphas_cumprod = torch.cumprod(1 - betas, 0)
    for step in range(6):
        x0 = torch.randn(64, 16)
        t = torch.randint(0, 1000, (64,))
        noise = torch.randn_like(x0)
        a = alphas_cumprod[t][:, None]
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        with torch.autocast("cpu", dtype=torch.float16):
            eps = model(x_t, t)
        loss = F.mse_loss(eps.float(), noise)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
