"""Clean twin of bf16_on_s80.py: FP16, which every MTT card runs."""
import torch
import torch.nn as nn

model = nn.Linear(8, 8)
x = torch.randn(4, 8)
with torch.autocast(device_type="musa", dtype=torch.float16):
    y = model(x)
