"""An LSTM sequence tagger with argparse and BF16 autocast, the loss computed in FP32. Clean."""
import argparse

import torch
import torch.nn as nn

from common.data import SyntheticTokens, seed_everything


class Tagger(nn.Module):
    def __init__(self, vocab, d=32, hidden=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * hidden, vocab)

    def forward(self, tokens):
        out, _ = self.rnn(self.emb(tokens))
        return self.proj(out)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    return p.parse_args()


if __name__ == "__main__":
    args = parse()
    seed_everything(0)
    data = SyntheticTokens(n=64, length=16)
    model = Tagger(64)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        x, y = data[step * 8:(step + 1) * 8]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
