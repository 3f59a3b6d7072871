"""A DDPM trainer in the style of lucidrains/denoising-diffusion-pytorch (MIT): a small U-Net-like network with
RMSNorm (`F.normalize` times a learned gain and sqrt(dim)), a sinusoidal time embedding, linear attention,
the v-prediction objective with a min-SNR loss weight, Adam at 8e-5 with `gradient_accumulate_every = 2`,
the loss divided by it, gradients clipped at 1.0 after `unscale_`, an EMA copy, FP16 autocast, a
warmup LambdaLR schedule.

Planted (held out): `scheduler.step()` sits inside the accumulation loop, so the warmup schedule advances
twice per optimizer step.
"""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report

ACCUM, WARMUP = 2, 8


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = dim ** 0.5
        self.g = nn.Parameter(torch.ones(1, dim, 1, 1))

    def forward(self, x):
        return F.normalize(x, dim=1) * self.g * self.scale


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim, theta=10000):
        super().__init__()
        self.dim, self.theta = dim, theta

    def forward(self, t):
        half = self.dim // 2
        emb = torch.exp(torch.arange(half, device=t.device) * -(math.log(self.theta) / (half - 1)))
        emb = t[:, None].float() * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class LinearAttention(nn.Module):
    def __init__(self, dim, heads=2, dim_head=16):
        super().__init__()
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = RMSNorm(dim)
        self.to_qkv = nn.Conv2d(dim, heads * dim_head * 3, 1, bias=False)
        self.to_out = nn.Sequential(nn.Conv2d(heads * dim_head, dim, 1), RMSNorm(dim))

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.to_qkv(self.norm(x)).chunk(3, dim=1)
        q, k, v = (t.reshape(b, self.heads, -1, h * w) for t in (q, k, v))
        q, k = q.softmax(dim=-2) * self.scale, k.softmax(dim=-1)
        context = torch.einsum("bhdn,bhen->bhde", k, v)
        out = torch.einsum("bhde,bhdn->bhen", context, q).reshape(b, -1, h, w)
        return self.to_out(out)


class Unet(nn.Module):
    def __init__(self, dim=16, channels=3):
        super().__init__()
        self.time_mlp = nn.Sequential(SinusoidalPosEmb(dim), nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.init_conv = nn.Conv2d(channels, dim, 7, padding=3)
        self.block1 = nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), RMSNorm(dim), nn.SiLU())
        self.attn = LinearAttention(dim)
        self.block2 = nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), RMSNorm(dim), nn.SiLU())
        self.final = nn.Conv2d(dim, channels, 1)

    def forward(self, x, t):
        h = self.init_conv(x) + self.time_mlp(t)[:, :, None, None]
        h = self.block1(h)
        h = h + self.attn(h)
        return self.final(self.block2(h))


def cosine_alphas_cumprod(steps, s=0.008):
    t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
    ac = torch.cos((t + s) / (1 + s) * math.pi * 0.5) ** 2
    betas = torch.clip(1 - (ac[1:] / ac[:-1]), 0, 0.999)
    return torch.cumprod(1.0 - betas, dim=0).float()


def p_losses(model, x_start, alphas_cumprod, min_snr_gamma=5.0):
    t = torch.randint(0, alphas_cumprod.shape[0], (x_start.shape[0],))
    noise = torch.randn_like(x_start)
    a = alphas_cumprod[t].sqrt()[:, None, None, None]
    s = (1 - alphas_cumprod[t]).sqrt()[:, None, None, None]
    x = a * x_start + s * noise
    v = a * noise - s * x_start
    out = model(x, t)
    snr = alphas_cumprod[t] / (1 - alphas_cumprod[t])
    weight = snr.clamp(max=min_snr_gamma) / (snr + 1)
    loss = F.mse_loss(out.float(), v, reduction="none").mean(dim=(1, 2, 3))
    return (loss * weight).mean()


def main():
    torch.manual_seed(0)
    model = Unet()
    ema = copy.deepcopy(model).requires_grad_(False)
    alphas_cumprod = cosine_alphas_cumprod(100)
    opt = torch.optim.Adam(model.parameters(), lr=8e-5, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / WARMUP))
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        for _ in range(ACCUM):
            data = torch.rand(4, 3, 16, 16) * 2 - 1
            with torch.autocast("cpu", dtype=torch.float16):
                loss = p_losses(model, data, alphas_cumprod) / ACCUM
            scaler.scale(loss).backward()
            scheduler.step()  # planted: scheduler-every-microbatch
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters()):
                pe.lerp_(p, 1 - 0.995)
    report(loss, defect=scheduler.last_epoch > 4)


if __name__ == "__main__":
    main()
