"""A tiny causal language model trained on left-padded batches, FP16 autocast with a GradScaler.

Planted: the additive attention mask is built in the scores' dtype, `(1 - mask) * -1e9`: -1e9 does not
fit FP16 (max 65504) and becomes -inf; a pad query that may only see pad keys gets a row of -inf and
softmax returns NaN.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, pad_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.n_heads)
        causal = torch.tril(torch.ones(T, T, device=x.device))
        mask = (causal[None, None] * pad_mask[:, None, None, :]).to(scores.dtype)
        scores = scores + (1.0 - mask) * -1e9  # expect: nonfinite-forward
        att = F.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d_model=32, n_heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids, pad_mask):
        h = self.emb(ids)
        h = h + self.attn(h, pad_mask)
        return self.head(h)


def batches(n, batch=8, T=12, vocab=64):
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        ids = torch.randint(1, vocab, (batch, T), generator=g)
        lengths = torch.randint(T // 2, T + 1, (batch,), generator=g)
        pad = torch.arange(T)[None, :] >= (T - lengths)[:, None]  # left padding
        yield ids.masked_fill(~pad, 0), pad.float()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cpu")
    for ids, pad in batches(args.steps):
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(ids[:, :-1], pad[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 64), ids[:, 1:].reshape(-1), ignore_index=0)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
