# Modelled on jik876/hifi-gan train.py (MIT): per-rank device from a format string, a backend read
# from the config, seeding and GPU counting through torch.cuda. Written for ampkit's judge corpus.
import argparse
import json

import torch
import torch.multiprocessing as mp
from torch.distributed import init_process_group
from torch.nn.parallel import DistributedDataParallel

DEFAULT_CONFIG = {"seed": 1234, "batch_size": 16, "num_gpus": 0,
                  "dist_config": {"dist_backend": "nccl", "dist_url": "tcp://localhost:54321", "world_size": 1}}


def train(rank, a, h, generator_cls):
    if h["num_gpus"] > 1:
        init_process_group(backend=h["dist_config"]["dist_backend"], init_method=h["dist_config"]["dist_url"],
                           world_size=h["dist_config"]["world_size"] * h["num_gpus"], rank=rank)

    torch.cuda.manual_seed(h["seed"])
    device = torch.device('cuda:{:d}'.format(rank))

    generator = generator_cls().to(device)
    if rank == 0:
        print("checkpoints directory : ", a.checkpoint_path)
    if h["num_gpus"] > 1:
        generator = DistributedDataParallel(generator, device_ids=[rank]).to(device)
    optim_g = torch.optim.AdamW(generator.parameters(), 2e-4, betas=[0.8, 0.99])
    for x, y in a.loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        loss = torch.nn.functional.l1_loss(generator(x), y) * 45
        optim_g.zero_grad()
        loss.backward()
        optim_g.step()


def main(generator_cls):
    parser = argparse.ArgumentParser()
    parser.add_argument('--checkpoint_path', default='cp_hifigan')
    parser.add_argument('--config', default='')
    a = parser.parse_args()
    h = json.load(open(a.config)) if a.config else dict(DEFAULT_CONFIG)

    torch.manual_seed(h["seed"])
    if torch.cuda.is_available():
        torch.cuda.manual_seed(h["seed"])
        h["num_gpus"] = torch.cuda.device_count()
        h["batch_size"] = int(h["batch_size"] / h["num_gpus"])
        print('Batch size per GPU :', h["batch_size"])
    if h["num_gpus"] > 1:
        mp.spawn(train, nprocs=h["num_gpus"], args=(a, h, generator_cls))
    else:
        train(0, a, h, generator_cls)
