"""Attention through torch's scaled_dot_product_attention with dropout, as HF GPT-2 and BERT train with it."""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, 4)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)).mean(1)


model = Attention()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x, y = torch.randn(4, 8, 16), torch.randint(0, 4, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
