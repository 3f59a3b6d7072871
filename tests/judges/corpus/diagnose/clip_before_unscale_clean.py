"""Self-distillation in the style of facebookresearch/dino's main_dino.py and utils.py (Apache-2.0): a
student and an EMA teacher, the DINO loss (centred, sharpened teacher softmax against the student's
log-softmax), DINO's own per-parameter `clip_gradients`, FP16 autocast with `fp16_scaler`.

Clean twin of clip_before_unscale.py: `fp16_scaler.unscale_(optimizer)` before clipping, as DINO does.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report

CLIP_GRAD = 3.0


class DINOLoss(nn.Module):
    def __init__(self, out_dim, warmup_teacher_temp=0.04, student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp, self.teacher_temp, self.center_momentum = student_temp, warmup_teacher_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student_output, teacher_output):
        student_out = student_output / self.student_temp
        teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1).detach()
        loss = torch.sum(-teacher_out * F.log_softmax(student_out, dim=-1), dim=-1).mean()
        self.center = self.center * self.center_momentum + teacher_output.mean(0, keepdim=True) * (1 - self.center_momentum)
        return loss


def clip_gradients(model, clip):
    clipped = 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
                clipped += 1
    return clipped


def head(d_in=32, out_dim=64):
    return nn.Sequential(nn.Linear(d_in, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, out_dim))


def main():
    torch.manual_seed(0)
    student, teacher = head(), head()
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    dino_loss = DINOLoss(64)
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    fp16_scaler = torch.amp.GradScaler("cpu")
    clipped_share = 0.0
    for it in range(5):
        images = torch.randn(32, 32)
        views = images + 0.1 * torch.randn_like(images), images + 0.1 * torch.randn_like(images)
        with torch.autocast("cpu", dtype=torch.float16):
            teacher_output = teacher(views[0])
            student_output = student(views[1])
            loss = dino_loss(student_output.float(), teacher_output.float())
        optimizer.zero_grad()
        fp16_scaler.scale(loss).backward()
        fp16_scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
        clipped = clip_gradients(student, CLIP_GRAD)
        clipped_share = max(clipped_share, clipped / len(list(student.parameters())))
        fp16_scaler.step(optimizer)
        fp16_scaler.update()
        with torch.no_grad():
            for param_q, param_k in zip(student.parameters(), teacher.parameters()):
                param_k.data.mul_(0.996).add_((1 - 0.996) * param_q.detach().data)
    report(loss, defect=clipped_share > 0.9)


if __name__ == "__main__":
    main()
