"""A multi-label answer head trained in the style of salesforce/LAVIS's runner and VQA task (BSD-3-Clause):
question features scored against answer embeddings by scaled cosine similarity, soft multi-label targets,
a train step under autocast (BF16 here) as LAVIS wraps it with `use_amp`.

Clean twin of bce_under_autocast.py: `F.binary_cross_entropy_with_logits` on FP32 logits; the sigmoid is
never rounded before the log.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report


class AnswerHead(nn.Module):
    def __init__(self, d_in=48, d=32, n_answers=64, scale=10.0):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 64), nn.GELU(), nn.Linear(64, d))
        self.answers = nn.Parameter(torch.randn(n_answers, d))
        self.scale = scale

    def forward(self, questions):
        q = F.normalize(self.encoder(questions), dim=-1)
        return self.scale * q @ F.normalize(self.answers, dim=-1).t()


def train_step(model, optimizer, samples):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(samples["questions"])
    loss = F.binary_cross_entropy_with_logits(logits.float(), samples["targets"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    saturated = ((torch.sigmoid(logits.float()) == 1) & (samples["targets"] == 0)).any().item()
    return loss, saturated


def main():
    torch.manual_seed(0)
    model = AnswerHead()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.no_grad():  # questions start close to some answers, as with a pretrained encoder
        questions = torch.randn(16, 48)
        model.answers[:16] = model.encoder(questions)
    saturated_any = False
    for step in range(4):
        targets = torch.zeros(16, 64)
        targets[torch.arange(16), torch.randint(16, 64, (16,))] = 1.0
        loss, saturated = train_step(model, optimizer, {"questions": questions, "targets": targets})
        saturated_any |= saturated
    report(loss, defect=saturated_any)


if __name__ == "__main__":
    main()
