"""Clean twin of tiny_gpt: a small GPT with transformer blocks, BF16 autocast, a config dataclass and a get_batch helper.
Clean: the scaler is enabled only for FP16."""
import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab: int = 64
    block: int = 32
    d: int = 64
    heads: int = 4
    layers: int = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d)
        self.proj = nn.Linear(cfg.d, cfg.d)
        self.heads = cfg.heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d), nn.LayerNorm(cfg.d)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d, 4 * cfg.d), nn.GELU(), nn.Linear(4 * cfg.d, cfg.d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Parameter(torch.zeros(1, cfg.block, cfg.d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos[:, : idx.size(1)]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss


def get_batch(cfg, batch_size, generator):
    start = torch.randint(0, cfg.vocab, (batch_size, 1), generator=generator)
    seq = (start + torch.arange(cfg.block + 1)) % cfg.vocab
    return seq[:, :-1], seq[:, 1:]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.manual_seed(1337)
    cfg = GPTConfig()
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    dtype = torch.bfloat16
    scaler = torch.amp.GradScaler("cpu", enabled=(dtype == torch.float16))
    g = torch.Generator().manual_seed(0)
    for it in range(args.iters):
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * it / args.iters))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(cfg, 8, g)
        with torch.autocast("cpu", dtype=dtype):
            _, loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
