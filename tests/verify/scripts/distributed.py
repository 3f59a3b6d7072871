"""A multi-process script: it starts torch.distributed itself (refused)."""

import os
import socket

import torch.distributed as dist

# A port free now, not a fixed one: should the refusal ever let init_process_group through, parallel test
# workers (pytest -n) and other jobs on the machine still never collide on it.
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
