"""Fine-tuning a 'pretrained' classifier: the script halves the model to save memory and trains with a
GradScaler. Planted: FP16 parameters with a GradScaler (fp16-params-with-scaler)."""
import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


def load_pretrained():
    torch.manual_seed(0)
    return Classifier()


model = load_pretrained().half()  # planted
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu")
for step in range(4):
    x, y = torch.randn(16, 32).half(), torch.randint(0, 4, (16,))
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
