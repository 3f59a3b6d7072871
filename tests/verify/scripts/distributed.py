"""A multi-process script: it starts torch.distributed itself (refused)."""

import os

import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29555")
dist.init_process_group("gloo", rank=0, world_size=1)
