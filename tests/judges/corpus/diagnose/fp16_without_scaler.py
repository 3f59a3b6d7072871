"""A tiny language-model trainer in the style of karpathy/llama2.c's train.py (MIT): token embedding, an
MLP block, a tied output, gradient accumulation with the loss divided by the number of micro-batches,
FP16 autocast.

Planted: FP16 autocast with no GradScaler (llama2.c makes one with enabled=(dtype == "float16"); this
script dropped it when moving from BF16 to FP16): the per-token gradients, divided by 8 micro-batches,
underflow FP16 in the backward and a large share of the weight gradients come out as exact zeros.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report, zero_share

GRADIENT_ACCUMULATION_STEPS = 8
VOCAB, DIM, BATCH, SEQ = 512, 32, 4, 64


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.w1 = nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = nn.Linear(4 * DIM, DIM, bias=False)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, tokens, targets):
        h = self.tok_embeddings(tokens)
        h = h + self.w2(F.silu(self.w1(h)))
        logits = self.output(h)
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def main():
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
    ctx = torch.autocast("cpu", dtype=torch.float16)
    underflow = 0.0
    for it in range(2):
        for micro_step in range(GRADIENT_ACCUMULATION_STEPS):
            X = torch.randint(0, VOCAB, (BATCH, SEQ))
            Y = torch.roll(X, -1, dims=1)
            with ctx:
                loss = model(X, Y)
                loss = loss / GRADIENT_ACCUMULATION_STEPS
            loss.backward()  # planted: fp16-without-scaler
            if micro_step == 0:
                underflow = max(underflow, zero_share(model.w1.weight.grad))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    report(loss, defect=underflow > 0.05)


if __name__ == "__main__":
    main()
