"""A one-level detector trained in the style of rwightman/efficientdet-pytorch's train.py and effdet/loss.py
(Apache-2.0): a separable-conv backbone with BatchNorm and SiLU, class and box heads over 9 anchors, the
focal loss (alpha 0.25, gamma 1.5, label smoothing, `(1 - p_t) ** gamma`) and the Huber box loss (delta 0.1)
normalised by the number of positives, both computed in FP32 from the heads' outputs, timm's `NativeScaler`
(scale, backward, `unscale_`, `clip_grad_norm_(10.0)`, step, update in one call), a model EMA (decay 0.9998),
AdamW with a per-update cosine schedule, FP16 autocast. Clean (held out): diagnose must say nothing.
"""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report

NUM_CLASSES, NUM_ANCHORS = 4, 9


class NativeScaler:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()


def sep_conv(c_in, c_out, stride=1):
    return nn.Sequential(nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False), nn.Conv2d(c_in, c_out, 1, bias=False),
                         nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.01), nn.SiLU())


class Detector(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.SiLU())
        self.blocks = nn.Sequential(sep_conv(width, width, 2), sep_conv(width, width * 2, 2), sep_conv(width * 2, width * 2))
        self.class_net = nn.Sequential(sep_conv(width * 2, width * 2), nn.Conv2d(width * 2, NUM_ANCHORS * NUM_CLASSES, 1))
        self.box_net = nn.Sequential(sep_conv(width * 2, width * 2), nn.Conv2d(width * 2, NUM_ANCHORS * 4, 1))
        nn.init.constant_(self.class_net[-1].bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, x):
        feat = self.blocks(self.stem(x))
        return self.class_net(feat), self.box_net(feat)


def focal_loss(logits, targets, alpha, gamma, normalizer, label_smoothing=0.01):
    pred_prob = logits.sigmoid()
    onem_targets = 1.0 - targets
    p_t = targets * pred_prob + onem_targets * (1.0 - pred_prob)
    alpha_factor = targets * alpha + onem_targets * (1.0 - alpha)
    modulating_factor = (1.0 - p_t) ** gamma
    if label_smoothing > 0:
        targets = targets * (1.0 - label_smoothing) + 0.5 * label_smoothing
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return (1 / normalizer) * alpha_factor * modulating_factor * ce


def huber_loss(input, target, delta, weights):
    abs_err = (input - target).abs()
    quadratic = torch.clamp(abs_err, max=delta)
    linear = abs_err - quadratic
    return ((0.5 * quadratic.pow(2) + delta * linear) * weights).sum()


def detection_loss(cls_out, box_out, cls_targets, box_targets):
    b, _, h, w = cls_out.shape
    positives = (cls_targets.sum(-1) > 0).float()
    num_positives = positives.sum() + 1.0
    cls_logits = cls_out.float().permute(0, 2, 3, 1).reshape(b, h, w, NUM_ANCHORS, NUM_CLASSES)
    cls_loss = focal_loss(cls_logits, cls_targets, alpha=0.25, gamma=1.5, normalizer=num_positives).sum()
    box = box_out.float().permute(0, 2, 3, 1).reshape(b, h, w, NUM_ANCHORS, 4)
    box_loss = huber_loss(box, box_targets, delta=0.1, weights=positives[..., None]) / (num_positives * 4.0)
    return cls_loss + 50.0 * box_loss


def random_targets(b, h=8, w=8):
    labels = torch.randint(0, NUM_CLASSES + 1, (b, h, w, NUM_ANCHORS))
    labels[torch.rand(b, h, w, NUM_ANCHORS) < 0.95] = 0
    cls_targets = F.one_hot(labels, NUM_CLASSES + 1)[..., 1:].float()
    return cls_targets, torch.randn(b, h, w, NUM_ANCHORS, 4) * 0.1


def main():
    torch.manual_seed(0)
    model = Detector()
    model_ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=4e-5)
    steps = 6
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    loss_scaler = NativeScaler()
    for step in range(steps):
        images = torch.randn(8, 3, 64, 64)
        cls_targets, box_targets = random_targets(8)
        with torch.autocast("cpu", dtype=torch.float16):
            cls_out, box_out = model(images)
        loss = detection_loss(cls_out, box_out, cls_targets, box_targets)
        optimizer.zero_grad()
        loss_scaler(loss, optimizer, clip_grad=10.0, parameters=model.parameters())
        scheduler.step()
        with torch.no_grad():
            for e, m in zip(model_ema.state_dict().values(), model.state_dict().values()):
                if e.dtype.is_floating_point:
                    e.copy_(e * 0.9998 + (1.0 - 0.9998) * m)
    report(loss, defect=not all(torch.isfinite(p).all() for p in model.parameters()))


if __name__ == "__main__":
    main()
