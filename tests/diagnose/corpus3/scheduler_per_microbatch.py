"""A small transformer encoder fine-tuned with gradient accumulation (4 micro-batches per step), BF16
autocast, a linear warm-up/decay schedule planned in optimizer steps.

Planted: `scheduler.step()` sits in the micro-batch loop, outside the accumulation branch: the schedule
advances 4 times per optimizer step and the LR reaches 0 after a quarter of the run.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

ACCUM = 4
TOTAL_STEPS = 10


class Encoder(nn.Module):
    def __init__(self, vocab=100, d=32, n_classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, batch_first=True)
        self.cls = nn.Linear(d, n_classes)

    def forward(self, ids):
        return self.cls(self.layer(self.emb(ids)).mean(dim=1))


def lr_lambda(step, warmup=2):
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (TOTAL_STEPS - step) / (TOTAL_STEPS - warmup))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    g = torch.Generator().manual_seed(0)
    for i in range(ACCUM * 3):
        ids = torch.randint(0, 100, (8, 12), generator=g)
        labels = torch.randint(0, 3, (8,), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(ids), labels) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step()  # expect: scheduler-every-microbatch
