# Modelled on facebookresearch/pycls pycls/core/config.py, distributed.py and trainer.py (MIT): the
# backend in the config, the current device index from torch.cuda, amp imported from torch.cuda.
# Written for ampkit's judge corpus.
import torch
from torch.cuda import amp

_C = {"NUM_GPUS": 1, "DIST_BACKEND": "nccl", "HOST": "localhost", "TRAIN": {"MIXED_PRECISION": True}}


def setup_distributed(local_rank, port):
    torch.distributed.init_process_group(backend=_C["DIST_BACKEND"], init_method=f"tcp://{_C['HOST']}:{port}",
                                         world_size=_C["NUM_GPUS"], rank=local_rank)
    torch.cuda.set_device(local_rank)


def setup_model(model):
    cur_device = torch.cuda.current_device()
    model = model.cuda(device=cur_device)
    if _C["NUM_GPUS"] > 1:
        model = torch.nn.parallel.DistributedDataParallel(module=model, device_ids=[cur_device], output_device=cur_device)
    return model


def train_epoch(loader, model, loss_fun, optimizer):
    scaler = amp.GradScaler(enabled=_C["TRAIN"]["MIXED_PRECISION"])
    for inputs, labels in loader:
        inputs, labels = inputs.cuda(), labels.cuda(non_blocking=True)
        with amp.autocast(enabled=_C["TRAIN"]["MIXED_PRECISION"]):
            preds = model(inputs)
            loss = loss_fun(preds, labels)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
