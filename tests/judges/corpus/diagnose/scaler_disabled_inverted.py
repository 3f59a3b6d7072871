"""A classification trainer in the style of facebookresearch/pycls's core/trainer.py (MIT): a config object,
a GradScaler built from the config's mixed-precision flag, a token tagger over 512 classes with label
smoothing, gradient accumulation over micro-batches, SGD with momentum.

Planted: the scaler's flag is inverted (enabled=is_bf16 where it should be `not is_bf16`): it exists and
is called, but under FP16 it is disabled, so the small per-class gradients underflow to exact zeros.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report, zero_share


class cfg:  # noqa: N801 (pycls's config is a global namespace)
    MIXED_PRECISION = True
    DTYPE = "float16"
    NUM_CLASSES = 512
    VOCAB = 512
    BATCH_SIZE = 4
    SEQ_LEN = 64
    ACCUM_STEPS = 8
    BASE_LR = 0.1
    LABEL_SMOOTHING = 0.1


class TokenTagger(nn.Module):
    """Per-token classification (one of NUM_CLASSES tags per token), GPT-style 0.02 init."""

    def __init__(self, width=32):
        super().__init__()
        self.embed = nn.Embedding(cfg.VOCAB, width)
        self.mix = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)
        self.head = nn.Linear(width, cfg.NUM_CLASSES, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        h = self.embed(tokens)
        return self.head(h + self.proj(F.gelu(self.mix(h))))


def train_epoch(model, optimizer, scaler, amp_dtype, steps=2):
    underflow = 0.0
    for cur_iter in range(steps * cfg.ACCUM_STEPS):
        inputs = torch.randint(0, cfg.VOCAB, (cfg.BATCH_SIZE, cfg.SEQ_LEN))
        labels = torch.randint(0, cfg.NUM_CLASSES, (cfg.BATCH_SIZE * cfg.SEQ_LEN,))
        with torch.autocast("cpu", dtype=amp_dtype, enabled=cfg.MIXED_PRECISION):
            preds = model(inputs).flatten(0, 1)
            loss = F.cross_entropy(preds.float(), labels, label_smoothing=cfg.LABEL_SMOOTHING) / cfg.ACCUM_STEPS
        scaler.scale(loss).backward()
        if cur_iter % cfg.ACCUM_STEPS == 0:
            underflow = max(underflow, zero_share(model.mix.weight.grad))
        if (cur_iter + 1) % cfg.ACCUM_STEPS == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    return loss, underflow


def main():
    torch.manual_seed(0)
    model = TokenTagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.BASE_LR, momentum=0.9, weight_decay=5e-5)
    is_bf16 = cfg.DTYPE == "bfloat16"
    amp_dtype = torch.bfloat16 if is_bf16 else torch.float16
    scaler = torch.amp.GradScaler("cpu", enabled=cfg.MIXED_PRECISION and is_bf16)  # planted: fp16-without-scaler
    loss, underflow = train_epoch(model, optimizer, scaler, amp_dtype)
    report(loss, defect=underflow > 0.05)


if __name__ == "__main__":
    main()
