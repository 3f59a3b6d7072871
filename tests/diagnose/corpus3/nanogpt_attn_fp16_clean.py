"""nanoGPT's causal self-attention (masked_fill with -inf, then softmax) trained under FP16 autocast with a
GradScaler. Clean: the -inf are the mask, by design; softmax turns them into 0. Diagnose must say nothing."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=32, n_head=4, block_size=16):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT(nn.Module):
    def __init__(self, vocab=64, n_embd=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab)

    def forward(self, idx, targets):
        x = self.wte(idx)
        x = x + self.attn(self.ln(x))
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


if __name__ == "__main__":
    torch.manual_seed(0)
    dtype = torch.float16
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=(dtype == torch.float16))
    data = torch.randint(0, 64, (4, 8, 17))
    for it in range(4):
        x, y = data[it, :, :-1], data[it, :, 1:]
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
