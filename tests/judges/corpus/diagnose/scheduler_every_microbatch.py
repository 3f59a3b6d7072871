"""A contrastive image-text trainer in the style of mlfoundations/open_clip's train_one_epoch (MIT): two
small towers, a learnable logit scale, the symmetric CLIP loss, gradient accumulation (accum_freq), FP16
autocast with a GradScaler and a cosine schedule sized in optimizer steps.

Planted: the scheduler is stepped at every micro-batch, not at every optimizer step: the cosine schedule
runs accum_freq times too fast and the learning rate reaches its floor a quarter of the way in.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report

ACCUM_FREQ = 4
OPT_STEPS = 6


class TinyCLIP(nn.Module):
    def __init__(self, d_img=24, d_txt=16, d=32):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(d_img, 64), nn.GELU(), nn.Linear(64, d))
        self.text = nn.Sequential(nn.Linear(d_txt, 64), nn.GELU(), nn.Linear(64, d))
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, image, text):
        return (F.normalize(self.visual(image), dim=-1), F.normalize(self.text(text), dim=-1),
                self.logit_scale.exp())


def clip_loss(image_features, text_features, logit_scale):
    logits_per_image = logit_scale * image_features @ text_features.T
    labels = torch.arange(logits_per_image.shape[0])
    return (F.cross_entropy(logits_per_image.float(), labels) + F.cross_entropy(logits_per_image.T.float(), labels)) / 2


def main():
    torch.manual_seed(0)
    model = TinyCLIP()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, OPT_STEPS) / OPT_STEPS)))
    scaler = torch.amp.GradScaler("cpu")
    g = torch.Generator().manual_seed(0)
    opt_steps = 0
    for i in range(OPT_STEPS * ACCUM_FREQ):
        images, texts = torch.randn(16, 24, generator=g), torch.randn(16, 16, generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = clip_loss(*model(images, texts))
        scaler.scale(loss / ACCUM_FREQ).backward()
        scheduler.step()  # planted: scheduler-every-microbatch
        if (i + 1) % ACCUM_FREQ == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            opt_steps += 1
    report(loss, defect=scheduler.last_epoch != opt_steps)


if __name__ == "__main__":
    main()
