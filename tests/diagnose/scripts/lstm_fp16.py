"""Planted: dtype-unsupported. An LSTM under FP16 autocast on the CPU: oneDNN has no FP16 LSTM kernel."""
import torch
import torch.nn as nn

torch.manual_seed(0)
lstm, head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 1)
opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):  # planted defect: FP16 on the CPU
        out, _ = lstm(torch.randn(2, 5, 8))
        loss = head(out[:, -1]).float().pow(2).mean()
    loss.backward()
    opt.step()
