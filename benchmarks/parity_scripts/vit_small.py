"""timm ViT-S/16 (random weights) for two BF16 autocast steps on CUDA: `ampkit parity` input."""
import timm
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = timm.create_model("vit_small_patch16_224", num_classes=10, drop_rate=0.0).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(2):
    x, y = torch.randn(4, 3, 224, 224, device="cuda"), torch.randint(0, 10, (4,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
