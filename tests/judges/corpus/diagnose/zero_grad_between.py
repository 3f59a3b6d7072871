"""A run_step in the style of facebookresearch/detectron2's AMPTrainer (Apache-2.0): the model returns a
dict of losses (classification and box regression), their sum is backpropagated through a GradScaler.

Planted: `zero_grad()` sits between the backward and `scaler.step` (moved there while refactoring the
step); every step sees zero gradients and the weights never move.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import change, report, snapshot


class TinyDetectorHead(nn.Module):
    def __init__(self, d=32, n_classes=5):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.cls_score = nn.Linear(64, n_classes)
        self.bbox_pred = nn.Linear(64, 4)

    def forward(self, batch):
        h = self.trunk(batch["features"])
        loss_cls = F.cross_entropy(self.cls_score(h).float(), batch["labels"])
        loss_box = F.smooth_l1_loss(self.bbox_pred(h).float(), batch["boxes"], beta=0.0)
        return {"loss_cls": loss_cls, "loss_box_reg": loss_box}


class AMPTrainer:
    def __init__(self, model, data, optimizer):
        self.model, self.data, self.optimizer = model, data, optimizer
        self.grad_scaler = torch.amp.GradScaler("cpu")

    def run_step(self):
        batch = next(self.data)
        with torch.autocast("cpu", dtype=torch.float16):
            loss_dict = self.model(batch)
            losses = sum(loss_dict.values())
        self.grad_scaler.scale(losses).backward()
        self.optimizer.zero_grad(set_to_none=False)  # planted: zero-grad-between-backward-and-step
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        return losses


def batches():
    g = torch.Generator().manual_seed(0)
    while True:
        yield {"features": torch.randn(32, 32, generator=g), "labels": torch.randint(0, 5, (32,), generator=g),
               "boxes": torch.rand(32, 4, generator=g)}


def main():
    torch.manual_seed(0)
    model = TinyDetectorHead()
    trainer = AMPTrainer(model, batches(), torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9))
    before = snapshot(model)
    for _ in range(5):
        loss = trainer.run_step()
    report(loss, defect=change(model, before) == 0.0)


if __name__ == "__main__":
    main()
