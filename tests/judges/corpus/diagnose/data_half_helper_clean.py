"""Fine-tuning a small CLIP-like model in the style of openai/CLIP's clip/model.py (MIT): its
`convert_weights` helper turns Linear and Conv weights to FP16 in place (meant for inference), and the
fine-tuning loop then uses FP16 autocast with a GradScaler.

Clean twin of data_half_helper.py: the helper is kept for inference, and training runs on `model.float()`
(openai/CLIP's own advice), so the weights stay FP32 under autocast.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report


def convert_weights(model: nn.Module):
    """Convert applicable model parameters to fp16"""

    def _convert_weights_to_fp16(l):
        if isinstance(l, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            l.weight.data = l.weight.data.half()
            if l.bias is not None:
                l.bias.data = l.bias.data.half()

    model.apply(_convert_weights_to_fp16)


class TinyCLIP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.visual = nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.GELU(), nn.Flatten(), nn.Linear(16 * 16, d))
        self.token_embedding = nn.Embedding(100, d)
        self.text_projection = nn.Linear(d, d, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * 2.659)

    def forward(self, image, text):
        img = F.normalize(self.visual(image), dim=-1)
        txt = F.normalize(self.text_projection(self.token_embedding(text).mean(1)), dim=-1)
        return self.logit_scale.exp() * img @ txt.t()


def main():
    torch.manual_seed(0)
    model = TinyCLIP()
    convert_weights(model)  # as loaded for inference
    model.float()
    opt = torch.optim.Adam(model.parameters(), lr=5e-5, eps=1e-6)
    scaler = torch.amp.GradScaler("cpu")
    labels = torch.arange(8)
    for step in range(4):
        images, texts = torch.randn(8, 3, 16, 16), torch.randint(0, 100, (8, 12))
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(images, texts)
        loss = (F.cross_entropy(logits.float(), labels) + F.cross_entropy(logits.float().t(), labels)) / 2
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=any(p.dtype == torch.float16 for p in model.parameters()))


if __name__ == "__main__":
    main()
