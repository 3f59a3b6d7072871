"""A small ConvNeXt in the style of facebookresearch/ConvNeXt's models/convnext.py (MIT): a patchify stem,
its hand-written channels-first LayerNorm, depthwise 7x7 blocks with an inverted bottleneck and layer
scale, biases initialised to zero, FP16 autocast with a GradScaler. Images are zero-padded to a square.

Clean twin of layernorm_eps_fp16.py: ConvNeXt's eps of 1e-6, which FP16 keeps (as a subnormal), so the
padded patches normalise to 0.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _judge import report


class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps, self.data_format, self.normalized_shape = eps, data_format, (normalized_shape,)

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
    def __init__(self, dim, layer_scale_init_value=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale_init_value * torch.ones(dim))

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + h.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dim=32, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, kernel_size=4, stride=4), LayerNorm(dim, data_format="channels_first"))
        self.blocks = nn.Sequential(Block(dim), Block(dim))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, n_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(self.norm(x.mean([-2, -1])))


def pad_to_square(img, size=32):
    return F.pad(img, (0, size - img.shape[-1], 0, size - img.shape[-2]))


def main():
    torch.manual_seed(0)
    model = ConvNeXt()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cpu")
    finite_steps = 0
    for step in range(4):
        images = pad_to_square(torch.randn(8, 3, 32, 20))  # landscape crops padded on the right
        labels = torch.randint(0, 10, (8,))
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(images).float(), labels)
        finite_steps += int(torch.isfinite(loss).item())
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=finite_steps < 4)


if __name__ == "__main__":
    main()
