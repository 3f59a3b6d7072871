# Modelled on facebookresearch/dino main_dino.py and utils.py (Apache-2.0): init_distributed_mode with
# torch.cuda device counting and NCCL, modules moved with .cuda(), the fp16 scaler through torch.cuda.amp.
# Written for ampkit's judge corpus.
import os
import sys

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ['WORLD_SIZE'])
        args.gpu = int(os.environ['LOCAL_RANK'])
    elif 'SLURM_PROCID' in os.environ:
        args.rank = int(os.environ['SLURM_PROCID'])
        args.gpu = args.rank % torch.cuda.device_count()
    elif torch.cuda.is_available():
        print('Will run the code on one GPU.')
        args.rank, args.gpu, args.world_size = 0, 0, 1
    else:
        print('Does not support training without GPU.')
        sys.exit(1)
    dist.init_process_group(backend="nccl", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    torch.cuda.set_device(args.gpu)
    print('| distributed init (rank {}): {}'.format(args.rank, args.dist_url), flush=True)


def train_dino(args, student, teacher, data_loader, dino_loss, optimizer):
    student, teacher = student.cuda(), teacher.cuda()
    fp16_scaler = None
    if args.use_fp16:
        fp16_scaler = torch.cuda.amp.GradScaler()
    for it, (images, _) in enumerate(data_loader):
        images = [im.cuda(non_blocking=True) for im in images]
        with torch.cuda.amp.autocast(fp16_scaler is not None):
            loss = dino_loss(student(images), teacher(images[:2]))
        fp16_scaler.scale(loss).backward()
        fp16_scaler.step(optimizer)
        fp16_scaler.update()
