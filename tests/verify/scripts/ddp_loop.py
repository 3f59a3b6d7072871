"""A multi-process training script as users launch it: torchrun, gloo, DDP or FSDP2 (fully_shard), autocast.

torchrun --nproc-per-node 2 ddp_loop.py [--strategy ddp|fsdp2] [--precision bf16|fp16] [--input-scale S]

Every rank builds the same initial model (one seed), then draws its own batches (the seed plus its rank).
``--precision fp16 --input-scale 1e5`` is a real FP16 defect: the first layer's outputs (~1e5) overflow FP16
(max 65504) under autocast, so the GradScaler skips every step; in FP32 the LayerNorm brings them back.
``--die-rank R`` / ``--extra-step-rank R``: a rank that dies, a rank that steps once more (compare refuses both).
"""

import argparse
import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
parser.add_argument("--input-scale", type=float, default=1.0)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--die-rank", type=int, default=None, help="this rank dies (exit 3) at its third step")
parser.add_argument("--extra-step-rank", type=int, default=None, help="this rank takes one more optimizer step")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)

torch.manual_seed(args.seed)  # the same initial weights in every rank
model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 10))
if args.strategy == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
else:
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[3]):
        fully_shard(layer)
    fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)

torch.manual_seed(args.seed + 1 + rank)  # each rank its own batches
for step in range(args.steps):
    if rank == args.die_rank and step == 2:
        os._exit(3)
    idx = torch.randint(0, len(x), (32,))
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        loss = nn.functional.cross_entropy(model(x[idx] * args.input_scale), y[idx])
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
if rank == args.extra_step_rank:
    optimizer.step()  # no backward, no collective: only this rank counts one more step
if rank == 0:
    print(f"final loss {loss.item():.4f}")
dist.destroy_process_group()
