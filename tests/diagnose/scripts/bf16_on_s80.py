"""Planted: dtype-unsupported. BF16 autocast on a MUSA card; on an MTT S80 it has no BF16."""
import torch
import torch.nn as nn

model = nn.Linear(8, 8)
x = torch.randn(4, 8)
with torch.autocast(device_type="musa", dtype=torch.bfloat16):  # planted defect on S80/S3000
    y = model(x)
