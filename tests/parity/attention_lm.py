"""A small causal language model with hand-written attention, trained under autocast (BF16 by default)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        att = F.softmax(scores, dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class LM(nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb, self.norm, self.attn = nn.Embedding(vocab, d), nn.LayerNorm(d), Attention(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        x = x + self.attn(self.norm(x))
        pooled = x.sum(-1, keepdim=True) / x.shape[-1]
        return self.head(x - pooled)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    for step in range(3):
        idx = torch.randint(0, 50, (4, 16))
        with torch.autocast("cpu", dtype=dtype):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
