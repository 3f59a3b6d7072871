"""WGAN-GP on 2-D toy data, FP16 autocast with a GradScaler, following the "gradient penalty" recipe
(autograd.grad of the scaled critic output, create_graph=True).

Planted: the gradients returned by autograd.grad are still multiplied by the loss scale and are used
for the penalty as they are: the penalty is off by scale^2 and swamps the Wasserstein loss.
"""
import torch
import torch.nn as nn


def gradient_penalty(critic, real, fake, scaler):
    alpha = torch.rand(real.size(0), 1)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        score = critic(mixed)
    grads, = torch.autograd.grad(outputs=scaler.scale(score.sum()), inputs=mixed, create_graph=True)  # expect: grad-penalty-not-unscaled
    with torch.autocast("cpu", dtype=torch.float16):
        return ((grads.norm(2, dim=1) - 1) ** 2).mean()


def main(iters=3, batch=32, lambda_gp=10.0):
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    critic = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 1))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9))
    scaler = torch.amp.GradScaler("cpu")
    for it in range(iters):
        real = torch.randn(batch, 2) * 0.2 + torch.tensor([1.0, -1.0])
        with torch.autocast("cpu", dtype=torch.float16):
            fake = gen(torch.randn(batch, 4))
        gp = gradient_penalty(critic, real, fake.detach().float(), scaler)
        with torch.autocast("cpu", dtype=torch.float16):
            loss_c = critic(fake.detach()).mean() - critic(real).mean() + lambda_gp * gp
        opt_c.zero_grad()
        scaler.scale(loss_c).backward()
        scaler.step(opt_c)
        with torch.autocast("cpu", dtype=torch.float16):
            loss_g = -critic(gen(torch.randn(batch, 4))).mean()
        opt_g.zero_grad()
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()


if __name__ == "__main__":
    main()
