# Modelled on mlfoundations/open_clip src/open_clip_train/distributed.py, precision.py and main.py (MIT):
# the per-rank device string built by formatting and concatenation, tested by prefix, a scaler made for
# "amp" precisions. Written for ampkit's judge corpus.
import os

import torch
import torch.distributed as dist


def init_distributed_device(args):
    args.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if args.distributed:
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url)
    if torch.cuda.is_available():
        if args.distributed and not args.no_set_device_rank:
            device = 'cuda:%d' % args.local_rank
        else:
            device = 'cuda:0'
        torch.cuda.set_device(device)
    else:
        device = 'cpu'
    args.device = device
    return torch.device(device)


def local_device(rank):
    return "cuda:" + str(rank)


def make_scaler(args):
    use_bfloat16 = args.precision == "amp_bf16"
    return torch.amp.GradScaler() if use_bfloat16 else None


def log_device(args, logger):
    if args.device.startswith('cuda:'):
        logger.info(f'Running with a single process. Device {args.device}.')
    return torch.zeros(1, device=f"cuda:{args.local_rank}")
