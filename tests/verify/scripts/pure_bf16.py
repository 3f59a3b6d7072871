"""A pure-BF16 script: the model is converted with .to(torch.bfloat16), the optimizer updates BF16 weights, the
inputs are cast to BF16; no autocast. A linear regression whose weights start at 1.0.

python pure_bf16.py [--lr LR] [--noise SIGMA] [--steps N] [--created-bf16]

With a small learning rate (--lr 1e-3) every update (lr * grad, about 4e-4) is below half of BF16's rounding
step at 1.0 (2^-8 = 0.0039): BF16 loses every update and its loss stays where it started, while FP32 weights
move (a real harm). With --lr 0.05 the updates are larger than the rounding step until near the optimum; with
--noise 2 the loss there (about 4) is so much larger than what BF16's stalled last updates add that the harm is
well below 1 %.
--created-bf16 builds the layer with dtype=torch.bfloat16 (no conversion to switch off: compare refuses it).
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--noise", type=float, default=0.5)
parser.add_argument("--created-bf16", action="store_true")
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
x = torch.randn(1024, 16, generator=g)
w_true = 1.0 + 0.2 * torch.randn(16, generator=g)
y = x @ w_true + args.noise * torch.randn(1024, generator=g)

torch.manual_seed(0)
if args.created_bf16:
    model = nn.Linear(16, 1, bias=False, dtype=torch.bfloat16)
else:
    model = nn.Linear(16, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    model = model.to(torch.bfloat16)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for step in range(args.steps):
    idx = torch.randint(0, len(x), (256,))
    optimizer.zero_grad()
    pred = model(x[idx].to(torch.bfloat16)).float().squeeze(1)
    loss = nn.functional.mse_loss(pred, y[idx])
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
