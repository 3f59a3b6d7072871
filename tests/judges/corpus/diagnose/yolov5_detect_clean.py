"""A one-scale detector trained in the style of ultralytics/yolov5's train.py and utils/loss.py (AGPL-3.0): Conv
blocks (Conv2d + BatchNorm + SiLU), a Detect head with 3 anchors, the YOLO loss (CIoU box loss with
eps=1e-7 and `atan`, BCE-with-logits objectness against the IoU, class BCE) computed inside the autocast
region as YOLOv5 does, loss times the batch size, accumulation to a nominal batch of 64, a per-iteration
warmup of the learning rate and momentum by `np.interp`, `scaler.unscale_` then `clip_grad_norm_(10.0)`, an EMA
with a ramped decay, SGD with Nesterov momentum, FP16 autocast. Clean (held out): diagnose must say nothing.
"""
import math

import numpy as np
import torch
import torch.nn as nn

from _judge import report

NC, NA, NBS, BS = 3, 3, 64, 16


class Conv(nn.Module):
    def __init__(self, c1, c2, k=3, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), Conv(32, 32), Conv(32, 64, 3, 2))
        self.m = nn.Conv2d(64, NA * (5 + NC), 1)
        self.register_buffer("anchors", torch.tensor([[1.25, 1.625], [2.0, 3.75], [4.125, 2.875]]))

    def forward(self, x):
        p = self.m(self.backbone(x))
        b, _, ny, nx = p.shape
        return p.view(b, NA, 5 + NC, ny, nx).permute(0, 1, 3, 4, 2).contiguous()


def bbox_ciou(box1, box2, eps=1e-7):
    (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.chunk(4, -1), box2.chunk(4, -1)
    b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * \
            (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((x2 - x1) ** 2 + (y2 - y1) ** 2)
    v = (4 / math.pi ** 2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def compute_loss(p, targets, anchors):
    """targets: (n, 6) = image, class, x, y, w, h in grid units; every target is assigned to anchor 0 of its cell."""
    bce = nn.BCEWithLogitsLoss()
    b, a, gj, gi = targets[:, 0].long(), torch.zeros_like(targets[:, 0]).long(), targets[:, 3].long(), targets[:, 2].long()
    ps = p[b, a, gj, gi]
    pxy = ps[:, :2].sigmoid() * 2 - 0.5
    pwh = (ps[:, 2:4].sigmoid() * 2) ** 2 * anchors[a]
    tbox = torch.cat((targets[:, 2:4] - torch.stack((gi, gj), 1), targets[:, 4:6]), 1)
    iou = bbox_ciou(torch.cat((pxy, pwh), 1), tbox).squeeze(-1)
    lbox = (1.0 - iou).mean()
    tobj = torch.zeros(p.shape[:4], dtype=p.dtype)
    tobj[b, a, gj, gi] = iou.detach().clamp(0).type(tobj.dtype)
    lobj = bce(p[..., 4], tobj)
    t = torch.zeros_like(ps[:, 5:])
    t[range(len(b)), targets[:, 1].long()] = 1.0
    lcls = bce(ps[:, 5:], t)
    return (0.05 * lbox + 1.0 * lobj + 0.5 * lcls) * p.shape[0]


def random_targets(n_img, grid=8):
    rows = []
    for i in range(n_img):
        for _ in range(2):
            rows.append([i, np.random.randint(NC), *(np.random.rand(2) * (grid - 1)), *(np.random.rand(2) * 3 + 0.5)])
    return torch.tensor(rows, dtype=torch.float32)


def main():
    torch.manual_seed(0)
    np.random.seed(0)
    model = Detector()
    ema = Detector().requires_grad_(False)
    ema.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler("cpu")
    accumulate, last_opt_step, updates, nw = max(round(NBS / BS), 1), -1, 0, 20
    optimizer.zero_grad()
    for ni in range(8):
        if ni <= nw:
            accumulate = max(1, np.interp(ni, [0, nw], [1, NBS / BS]).round())
            for x in optimizer.param_groups:
                x["lr"] = np.interp(ni, [0, nw], [0.0, 0.01])
                x["momentum"] = np.interp(ni, [0, nw], [0.8, 0.937])
        imgs = torch.rand(BS, 3, 64, 64)
        targets = random_targets(BS)
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(imgs)
            loss = compute_loss(pred, targets, model.anchors)
        scaler.scale(loss).backward()
        if ni - last_opt_step >= accumulate:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            updates += 1
            d = 0.9999 * (1 - math.exp(-updates / 2000))
            with torch.no_grad():
                for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
                    if e.dtype.is_floating_point:
                        e.mul_(d).add_((1 - d) * m.detach())
            last_opt_step = ni
    report(loss, defect=not all(torch.isfinite(p).all() for p in model.parameters()))


if __name__ == "__main__":
    main()
