"""A small ViT in the style of lucidrains/vit-pytorch's vit.py (MIT): pre-norm blocks, multi-head attention
over patch tokens, mean pooling; the attention uses cosine-similarity logits with a temperature of 20
(as in its cosine-attention variants), FP16 autocast with a GradScaler.

Clean twin of naive_softmax.py: `dots.softmax(dim=-1)`, which subtracts the row maximum.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report


class Attention(nn.Module):
    def __init__(self, dim, heads=4, dim_head=16, temperature=20.0):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.temperature = heads, temperature
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x):
        b, n, _ = x.shape
        qkv = self.to_qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in qkv)
        dots = torch.matmul(F.normalize(q, dim=-1), F.normalize(k, dim=-1).transpose(-1, -2)) * self.temperature
        attn = dots.softmax(dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


class ViT(nn.Module):
    def __init__(self, patch=4, dim=64, depth=2, n_classes=10):
        super().__init__()
        self.to_patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.layers = nn.ModuleList(
            nn.ModuleList([Attention(dim), nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                                         nn.Linear(2 * dim, dim))]) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def forward(self, img):
        x = self.to_patch(img).flatten(2).transpose(1, 2) + self.pos
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.head(x.mean(dim=1))


def main():
    torch.manual_seed(0)
    model = ViT()
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cpu")
    finite_steps = 0
    for step in range(4):
        img, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(img)
        loss = F.cross_entropy(logits.float(), labels)
        finite_steps += int(torch.isfinite(loss).item())
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=finite_steps < 4)


if __name__ == "__main__":
    main()
