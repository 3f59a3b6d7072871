"""A sentence classifier with factorised embeddings (ALBERT-style: a small embedding projected up, no
bias) and a hand-written LayerNorm, FP16 autocast with a GradScaler.

Clean twin of layernorm_eps_fp16.py: eps=1e-5, which FP16 keeps (as a subnormal), so a padding
token gets (0 - 0) / sqrt(0 + 1e-5) = 0.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight * x + self.bias


class Classifier(nn.Module):
    def __init__(self, vocab=100, d_emb=8, d_model=32, n_classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_emb, padding_idx=0)
        self.up = nn.Linear(d_emb, d_model, bias=False)
        self.norm = LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU())
        self.out = nn.Linear(d_model, n_classes)

    def forward(self, ids):
        h = self.norm(self.up(self.emb(ids)))
        h = self.ff(h)
        keep = (ids != 0).unsqueeze(-1).to(h.dtype)
        return self.out((h * keep).sum(1) / keep.sum(1).clamp_min(1))


def make_data(n=64, T=10, vocab=100):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (n, T), generator=g)
    lengths = torch.randint(3, T + 1, (n,), generator=g)
    ids[torch.arange(T)[None, :] >= lengths[:, None]] = 0  # right padding
    return TensorDataset(ids, torch.randint(0, 4, (n,), generator=g))


def main():
    torch.manual_seed(0)
    model = Classifier()
    loader = DataLoader(make_data(), batch_size=16, shuffle=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for ids, labels in loader:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(ids)
        loss = F.cross_entropy(logits.float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


if __name__ == "__main__":
    main()
