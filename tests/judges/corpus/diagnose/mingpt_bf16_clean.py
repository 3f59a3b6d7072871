"""Clean: a GPT in the style of karpathy/minGPT's mingpt/model.py and trainer.py (MIT): NewGELU written
out with tanh and x**3, causal attention masked with -inf, attention and residual dropout, AdamW with
decay only on Linear weights, gradient clipping; BF16 autocast and no scaler (BF16 needs none).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import params_finite, report


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=48, n_head=3, block_size=24, pdrop=0.1):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(pdrop), nn.Dropout(pdrop)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k, q, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (k, q, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=24, n_embd=48, n_layer=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList()
        for _ in range(n_layer):
            self.blocks.append(nn.ModuleDict(dict(ln_1=nn.LayerNorm(n_embd), attn=CausalSelfAttention(), ln_2=nn.LayerNorm(n_embd),
                                                  mlp=nn.Sequential(nn.Linear(n_embd, 4 * n_embd), NewGELU(), nn.Linear(4 * n_embd, n_embd)))))
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)).unsqueeze(0))
        for b in self.blocks:
            x = x + b["attn"](b["ln_1"](x))
            x = x + b["mlp"](b["ln_2"](x))
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def configure_optimizers(model, lr=5e-4, weight_decay=0.1):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2 and "wte" not in n and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not any(p is q for q in decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def main():
    torch.manual_seed(3407)
    model = GPT()
    optimizer = configure_optimizers(model)
    model.train()
    for it in range(4):
        x = torch.randint(0, 64, (8, 24))
        y = torch.cat([x[:, 1:], torch.full((8, 1), -1)], dim=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
