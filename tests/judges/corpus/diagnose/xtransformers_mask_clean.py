"""Clean: attention in the style of lucidrains/x-transformers' attend.py (MIT): key-padding masks filled
with `-torch.finfo(dots.dtype).max` (its max_neg_value), ScaleNorm, softmax in FP32 on request, on
right-padded token batches; FP16 autocast with a GradScaler.

The mask value is the dtype's most negative number by design: it is neither an overflow nor NaN.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import params_finite, report


def max_neg_value(tensor):
    return -torch.finfo(tensor.dtype).max


class ScaleNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.scale = eps, dim ** -0.5
        self.g = nn.Parameter(torch.ones(1) * dim ** 0.5)

    def forward(self, x):
        return x / (torch.norm(x, dim=-1, keepdim=True) * self.scale).clamp(min=self.eps) * self.g


class Attention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_q, self.to_kv, self.to_out = nn.Linear(dim, dim, bias=False), nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_kv(x).chunk(2, dim=-1))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        dots = dots.masked_fill(~mask[:, None, None, :], max_neg_value(dots))
        attn = dots.softmax(dim=-1, dtype=torch.float32).type(dots.dtype)
        out = torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(b, n, d)
        return self.to_out(out)


class Encoder(nn.Module):
    def __init__(self, num_tokens=100, dim=64, depth=2, n_classes=3):
        super().__init__()
        self.emb = nn.Embedding(num_tokens, dim)
        self.layers = nn.ModuleList(nn.ModuleList([ScaleNorm(dim), Attention(dim), ScaleNorm(dim),
                                                   nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))])
                                    for _ in range(depth))
        self.to_logits = nn.Linear(dim, n_classes)

    def forward(self, ids, mask):
        x = self.emb(ids)
        for norm1, attn, norm2, ff in self.layers:
            x = x + attn(norm1(x), mask)
            x = x + ff(norm2(x))
        keep = mask.unsqueeze(-1).to(x.dtype)
        return self.to_logits((x * keep).sum(1) / keep.sum(1))


def main():
    torch.manual_seed(0)
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        lengths = torch.randint(4, 17, (8,))
        mask = torch.arange(16)[None, :] < lengths[:, None]
        ids = torch.randint(1, 100, (8, 16)).masked_fill(~mask, 0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(ids, mask).float(), torch.randint(0, 3, (8,)))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
