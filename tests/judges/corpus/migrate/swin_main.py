# Modelled on microsoft/Swin-Transformer main.py and utils.py (MIT): one process per GPU set up with
# torch.cuda and NCCL, modules and batches moved with .cuda(), torch.cuda.amp autocast and GradScaler,
# memory read for the log. Written for ampkit's judge corpus.
import os

import torch
import torch.distributed as dist


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            self._scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()
            return norm


def setup(config):
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(config.LOCAL_RANK)
    dist.init_process_group(backend='nccl', init_method='env://', world_size=world_size, rank=rank)
    dist.barrier()


def train_one_epoch(config, model, criterion, data_loader, optimizer, loss_scaler, logger):
    model.cuda()
    for idx, (samples, targets) in enumerate(data_loader):
        samples = samples.cuda(non_blocking=True)
        targets = targets.cuda(non_blocking=True)
        with torch.cuda.amp.autocast(enabled=config.AMP_ENABLE):
            outputs = model(samples)
        loss = criterion(outputs, targets)
        grad_norm = loss_scaler(loss, optimizer, clip_grad=config.TRAIN.CLIP_GRAD, parameters=model.parameters())
        torch.cuda.synchronize()
        memory_used = torch.cuda.max_memory_allocated() / (1024.0 * 1024.0)
        logger.info(f'Train: [{idx}/{len(data_loader)}] grad_norm {grad_norm:.4f} mem {memory_used:.0f}MB')
