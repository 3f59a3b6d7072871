"""A small causal transformer LM trained on random tokens under BF16 autocast, on CUDA when there is one, else the
CPU; DDP when launched by torchrun. Input for `ampkit compare` on the GPU (benchmarks/results/h200-*-compare-*)."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--width", type=int, default=512)
args = ap.parse_args()
distributed = "LOCAL_RANK" in os.environ
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
if distributed:
    torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(args.width, 8, 4 * args.width, dropout=0.0, batch_first=True, norm_first=True)
model = nn.Sequential(nn.Embedding(1000, args.width), nn.TransformerEncoder(layer, 4), nn.LayerNorm(args.width),
                      nn.Linear(args.width, 1000)).to(dev)
if distributed:
    model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
mask = nn.Transformer.generate_square_subsequent_mask(64, device=dev)
g = torch.Generator(device="cpu").manual_seed(1)
for step in range(args.steps):
    idx = torch.randint(0, 1000, (16, 65), generator=g).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        h = model[0](idx[:, :-1]) if not distributed else model.module[0](idx[:, :-1])
        body = model.module if distributed else model
        logits = body[3](body[2](body[1](h, mask=mask, is_causal=True)))
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
if distributed:
    torch.distributed.destroy_process_group()
