"""A tiny denoising-diffusion trainer in the style of openai/improved-diffusion (MIT): an MLP denoiser
with a timestep embedding, MSE on the predicted noise, FP16 autocast.

Planted: the loss is scaled by hand with a constant (improved-diffusion keeps a loss scale of its own
instead of a GradScaler); the scaled backward overflows FP16, the grads are divided back to inf/NaN and
the optimizer writes them into the weights: nothing skips the step.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import params_finite, report

LOSS_SCALE = 2.0 ** 22  # a fixed scale; improved-diffusion starts its own at 2 ** 20


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
        (loss * LOSS_SCALE).backward()  # planted: static-loss-scale
        for p in model.parameters():
            p.grad.div_(LOSS_SCALE)
        opt.step()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
