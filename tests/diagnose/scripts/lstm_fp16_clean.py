"""Clean twin of lstm_fp16: BF16 autocast with the LSTM run in FP32 inside it (no CPU has an FP16 LSTM
kernel, and one without AVX-512 has no BF16 one either), so it runs on every CPU."""
import torch
import torch.nn as nn

torch.manual_seed(0)
lstm, head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 1)
opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            out, _ = lstm(torch.randn(2, 5, 8))
        loss = head(out[:, -1]).float().pow(2).mean()
    loss.backward()
    opt.step()
