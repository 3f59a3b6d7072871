"""A GPT block pretrained in the style of Lightning-AI/litgpt's pretrain loop (Apache-2.0): RMSNorm with a
learnable scale, causal attention through scaled_dot_product_attention, an LLaMA MLP (SwiGLU), AdamW at
4e-4 with weight decay, the whole model cast to BF16 ("bf16-true").

Clean twin of bf16_weights_without_master.py: FP32 parameters (the master copy) under BF16 autocast
("bf16-mixed"); the RMSNorm scales move with every step.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report


class RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return (x * torch.rsqrt(norm_x + self.eps)).to(dtype) * self.weight


class Block(nn.Module):
    def __init__(self, n_embd=64, n_head=4, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.norm_1, self.norm_2, self.ln_f = RMSNorm(n_embd), RMSNorm(n_embd), RMSNorm(n_embd)
        self.attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.fc_1, self.fc_2 = nn.Linear(n_embd, 172, bias=False), nn.Linear(n_embd, 172, bias=False)
        self.mlp_proj = nn.Linear(172, n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.n_head = n_head

    def forward(self, idx):
        x = self.wte(idx)
        B, T, C = x.shape
        q, k, v = self.attn(self.norm_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm_2(x)
        x = x + self.mlp_proj(F.silu(self.fc_1(h)) * self.fc_2(h))
        return self.lm_head(self.ln_f(x))


def main():
    torch.manual_seed(0)
    model = Block()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1, betas=(0.9, 0.95))
    before = model.norm_1.weight.detach().clone()
    for step in range(4):
        idx = torch.randint(0, 256, (4, 32))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), idx[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    report(loss, defect=torch.equal(model.norm_1.weight.detach().float(), before.float()))


if __name__ == "__main__":
    main()
