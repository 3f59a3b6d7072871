"""A causal LM on left-padded batches, FP16 autocast with a GradScaler; the mask combines causality and key
padding and fills with -inf.

Clean twin of masked_row_nan.py: the mask fills with `torch.finfo(att.dtype).min`, so a row with no
visible key gets uniform weights instead of NaN. Diagnose must say nothing.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, pad):
        T = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        visible = torch.ones(T, T, dtype=torch.bool).tril()[None] & pad[:, None, :]
        att = att.masked_fill(~visible, torch.finfo(att.dtype).min)
        return self.proj(F.softmax(att, dim=-1) @ v)


class LM(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.attn = Attention(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, pad):
        h = self.emb(ids)
        return self.head(h + self.attn(h, pad))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ids = torch.randint(1, 64, (4, 12), generator=g)
        pad = torch.arange(12)[None, :] >= torch.tensor([0, 2, 4, 6])[:, None]  # left padding
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(ids[:, :-1], pad[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 64), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
