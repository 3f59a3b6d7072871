"""A text classifier whose repository has a "memory saver" helper that converts the linear layers' weights
in place with `weight.data = weight.data.half()`; training uses FP16 autocast with a GradScaler.

Planted: the helper makes the weights FP16 (the model is never `.half()`-ed): the GradScaler refuses to
unscale FP16 gradients ("Attempting to unscale FP16 gradients"). The fix is the helper's line.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def save_memory(model):
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.data = m.weight.data.half()  # expect: fp16-params-with-scaler


class BagOfWords(nn.Module):
    def __init__(self, vocab=200, d=32, n_classes=4):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, d)
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, n_classes)

    def forward(self, ids):
        return self.fc2(F.relu(self.fc1(self.emb(ids))))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = BagOfWords()
    save_memory(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ids = torch.randint(0, 200, (16, 10), generator=g)
        labels = torch.randint(0, 4, (16,), generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(ids)
        loss = F.cross_entropy(logits.float(), labels)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
