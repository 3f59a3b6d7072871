"""A decoder whose causal mask is its own module (as in several public codebases): `CausalMask` returns the
scores filled with -inf above the diagonal, and the attention block applies softmax to them. FP16 autocast
with a GradScaler. The mask module's output is non-finite by design; the model's output and the loss are
finite. Clean: diagnose must say nothing."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalMask(nn.Module):
    def forward(self, scores):
        T = scores.shape[-1]
        keep = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~keep, float("-inf"))


class Attention(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.mask = CausalMask()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = self.mask(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
        return self.proj(F.softmax(scores, dim=-1) @ v)


class Decoder(nn.Module):
    def __init__(self, vocab=48, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.attn = Attention(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(h + self.attn(h))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Decoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    data = torch.randint(0, 48, (3, 6, 11))
    for batch in data:
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 48), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
