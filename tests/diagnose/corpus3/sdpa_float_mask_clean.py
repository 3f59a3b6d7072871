"""A decoder block that calls `F.scaled_dot_product_attention` with a float `attn_mask` of 0 / -inf (causal
plus key padding, the way Hugging Face builds it), FP16 autocast with a GradScaler. Every query keeps at
least one visible key. Clean: diagnose must say nothing."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x, attn_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return x + self.proj(y.transpose(1, 2).reshape(B, T, C))


def build_mask(pad, dtype):
    T = pad.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    visible = causal[None] & pad[:, None, :]
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, float("-inf"))[:, None]


if __name__ == "__main__":
    torch.manual_seed(0)
    emb, block, head = nn.Embedding(60, 32), Block(), nn.Linear(32, 60)
    params = [*emb.parameters(), *block.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ids = torch.randint(0, 60, (4, 9), generator=g)
        pad = torch.arange(9)[None, :] < torch.randint(2, 10, (4,), generator=g)[:, None]
        with torch.autocast("cpu", dtype=torch.float16):
            logits = head(block(emb(ids), build_mask(pad, torch.float16)))
        loss = F.cross_entropy(logits.float().reshape(-1, 60), ids.reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
