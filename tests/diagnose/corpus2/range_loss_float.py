"""House-price regression (targets in the hundreds of thousands, scaled down only by 1000), FP16
autocast with a GradScaler; the loss is computed in FP32 on `pred.float()` as the AMP recipe advises.

Used by the --fp16-range tests: the squared error inside nn.MSELoss exceeds 65504, but the script
already computes the loss in FP32, so --fp16-range must not list the loss as a module to keep in FP32.
"""
import torch
import torch.nn as nn


class PriceModel(nn.Module):
    def __init__(self, n_features=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def data(n=64, n_features=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n_features, generator=g)
    price = 300.0 + 120.0 * x[:, 0] + 40.0 * x[:, 1] ** 2  # thousands
    return x, price


if __name__ == "__main__":
    torch.manual_seed(0)
    model = PriceModel()
    criterion = nn.MSELoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    x, price = data()
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(x)
            loss = criterion(pred.float(), price)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
