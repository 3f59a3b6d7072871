"""A few-shot prototype classifier with cosine logits and temperature, and a hand-written softmax
(from a research repo that avoided F.softmax to "see the math"), FP16 autocast with a GradScaler.

Clean twin of softmax_sum_overflow.py: the max is subtracted before exp, so every term is at most 1
and the sum at most the number of classes.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def softmax(logits, dim=-1):
    e = torch.exp(logits - logits.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


class CosineHead(nn.Module):
    def __init__(self, d, n_classes, temperature=10.0):
        super().__init__()
        self.prototypes = nn.Parameter(torch.randn(n_classes, d))
        self.temperature = temperature

    def forward(self, z):
        cos = F.normalize(z, dim=-1) @ F.normalize(self.prototypes, dim=-1).t()
        return softmax(self.temperature * cos)


class ProtoNet(nn.Module):
    def __init__(self, d_in=20, d=16, n_classes=12):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, d))
        self.head = CosineHead(d, n_classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def episodes(n, n_classes=12, per_class=4, d_in=20):
    g = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(d_in, generator=g) + 0.5 * torch.randn(n_classes, d_in, generator=g)  # fine-grained
    for _ in range(n):
        y = torch.arange(n_classes).repeat_interleave(per_class)
        yield centers[y] + 0.1 * torch.randn(len(y), d_in, generator=g), y


if __name__ == "__main__":
    torch.manual_seed(0)
    model = ProtoNet()
    with torch.no_grad():  # prototypes initialised from the class centres, as the paper does
        model.head.prototypes.copy_(model.encoder(next(episodes(1))[0]).view(12, 4, -1).mean(1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in episodes(3):
        with torch.autocast("cpu", dtype=torch.float16):
            probs = model(x)
        loss = F.nll_loss(torch.log(probs.float() + 1e-8), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
