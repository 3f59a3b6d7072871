"""Fine-tuning a small MLP "in BF16 to halve the memory": the model is converted with
`model.to(torch.bfloat16)` and AdamW updates the BF16 weights directly, at a fine-tuning learning rate.

Clean twin of bf16_pure_weights.py: the weights stay FP32 (the optimizer's master copy) and the forward
runs under BF16 autocast, which casts per op. Diagnose must say nothing.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=128, n_classes=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        x = torch.randn(64, 32, generator=g)
        y = torch.randint(0, 5, (64,), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
