"""A BERT-style encoder layer on right-padded batches, FP16 autocast with a GradScaler. The masks are built
the three ways public code builds them, all by design non-finite: `torch.where(causal, scores, -inf)`, an
additive padding mask of 0 / -inf added to the scores, and -inf padding of a pooled max. Every row keeps at
least one visible key. Clean: diagnose must say nothing."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, pad):
        T = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = torch.where(causal, scores, float("-inf"))
        additive = torch.zeros_like(pad, dtype=scores.dtype).masked_fill(~pad, float("-inf"))
        scores = scores + additive[:, None, :]
        h = self.out(F.softmax(scores, dim=-1) @ v)
        h = h.masked_fill(~pad[..., None], float("-inf"))
        return h.amax(dim=1)  # max-pool over the real tokens only


class Model(nn.Module):
    def __init__(self, vocab=80, d=32, n_classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layer = Layer(d)
        self.cls = nn.Linear(d, n_classes)

    def forward(self, ids, pad):
        return self.cls(self.layer(self.emb(ids), pad))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ids = torch.randint(1, 80, (8, 10), generator=g)
        lengths = torch.randint(3, 11, (8,), generator=g)
        pad = torch.arange(10)[None, :] < lengths[:, None]  # right padding: key 0 is always real
        labels = torch.randint(0, 3, (8,), generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(ids, pad)
        loss = F.cross_entropy(logits.float(), labels)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
