# Modelled on openai/improved-diffusion improved_diffusion/dist_util.py (MIT): torch imported as `th`,
# the backend chosen by torch.cuda availability, CUDA_VISIBLE_DEVICES set per rank, the device built with
# an f-string. Written for ampkit's judge corpus.
import os
import socket

import torch as th
import torch.distributed as dist

GPUS_PER_NODE = 8


def setup_dist(rank, world_size):
    if dist.is_initialized():
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = f"{rank % GPUS_PER_NODE}"
    backend = "gloo" if not th.cuda.is_available() else "nccl"
    hostname = "localhost" if backend == "gloo" else socket.gethostbyname(socket.getfqdn())
    os.environ["MASTER_ADDR"] = hostname
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    dist.init_process_group(backend=backend, init_method="env://")


def dev(rank):
    """Get the device to use for torch.distributed."""
    if th.cuda.is_available():
        return th.device(f"cuda:{rank % GPUS_PER_NODE}")
    return th.device("cpu")


def load_state_dict(path, **kwargs):
    return th.load(path, weights_only=True, **kwargs)
