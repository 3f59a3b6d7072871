"""A GAN vocoder step in the style of jaywalnut310/vits' train.py and commons.py (MIT): a generator and a
discriminator, two AdamW optimizers, one GradScaler shared by both steps (one `update()` after both),
FP16 autocast, a feature-matching and a least-squares adversarial loss, and a hand-written
`clip_grad_value_` that clamps each gradient element and returns the total norm.

Planted (held out): the discriminator's gradients are clamped to +-5 while still multiplied by the loss scale
(no `scaler.unscale_(optim_d)` before the clip): almost every element is clamped at every step.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report

CLIP_VALUE = 5.0


def clip_grad_value_(parameters, clip_value, norm_type=2):
    parameters = [p for p in parameters if p.grad is not None]
    total_norm, clamped = 0.0, 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
        if clip_value is not None:
            clamped += int((p.grad.data.abs() > clip_value).sum())
            p.grad.data.clamp_(min=-clip_value, max=clip_value)
    return total_norm ** (1.0 / norm_type), clamped


def generator():
    return nn.Sequential(nn.Conv1d(16, 32, 5, padding=2), nn.LeakyReLU(0.1), nn.Conv1d(32, 32, 5, padding=2),
                         nn.LeakyReLU(0.1), nn.Conv1d(32, 1, 7, padding=3), nn.Tanh())


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, 16, 15, padding=7), nn.Conv1d(16, 32, 11, stride=2, padding=5)])
        self.post = nn.Conv1d(32, 1, 3, padding=1)

    def forward(self, y):
        fmap = []
        for conv in self.convs:
            y = F.leaky_relu(conv(y), 0.1)
            fmap.append(y)
        return self.post(y).flatten(1), fmap


def main():
    torch.manual_seed(0)
    net_g, net_d = generator(), Discriminator()
    optim_g = torch.optim.AdamW(net_g.parameters(), 2e-4, betas=(0.8, 0.99), eps=1e-9)
    optim_d = torch.optim.AdamW(net_d.parameters(), 2e-4, betas=(0.8, 0.99), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu")
    clamped_share = 0.0
    for step in range(4):
        mel, wav = torch.randn(4, 16, 64), torch.randn(4, 1, 64).clamp(-1, 1)
        with torch.autocast("cpu", dtype=torch.float16):
            y_hat = net_g(mel)
            y_d_r, _ = net_d(wav)
            y_d_g, _ = net_d(y_hat.detach())
            loss_disc = torch.mean((1 - y_d_r.float()) ** 2) + torch.mean(y_d_g.float() ** 2)
        optim_d.zero_grad()
        scaler.scale(loss_disc).backward()
        _, clamped = clip_grad_value_(net_d.parameters(), CLIP_VALUE)  # planted: clip-before-unscale
        clamped_share = max(clamped_share, clamped / sum(p.numel() for p in net_d.parameters()))
        scaler.step(optim_d)
        with torch.autocast("cpu", dtype=torch.float16):
            y_d_r, fmap_r = net_d(wav)
            y_d_g, fmap_g = net_d(y_hat)
            loss_fm = sum(torch.mean(torch.abs(r.float().detach() - g.float())) for r, g in zip(fmap_r, fmap_g))
            loss_gen = torch.mean((1 - y_d_g.float()) ** 2) + 2 * loss_fm + 45 * F.l1_loss(y_hat.float(), wav)
        optim_g.zero_grad()
        scaler.scale(loss_gen).backward()
        scaler.unscale_(optim_g)
        clip_grad_value_(net_g.parameters(), None)
        scaler.step(optim_g)
        scaler.update()
    report(loss_gen, defect=clamped_share > 0.5)


if __name__ == "__main__":
    main()
