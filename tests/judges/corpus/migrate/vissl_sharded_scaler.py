# Modelled on facebookresearch/vissl vissl/trainer/train_task.py and train_steps/standard_train_step.py
# (MIT): a sharded (fairscale) or plain GradScaler chosen from the config, autocast through torch.cuda.amp,
# the device type tested by name. Written for ampkit's judge corpus.
import torch
from fairscale.optim.grad_scaler import ShardedGradScaler


class TrainTask:
    def __init__(self, config, device):
        self.config = config
        self.device = device
        self.amp_grad_scaler = None

    def _build_grad_scaler(self):
        if self.config["OPTIMIZER"]["use_zero"]:
            self.amp_grad_scaler = ShardedGradScaler()
        else:
            self.amp_grad_scaler = torch.cuda.amp.GradScaler()

    def train_step(self, model, optimizer, batch):
        sample = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        with torch.cuda.amp.autocast(enabled=self.amp_grad_scaler is not None):
            loss = model(sample["input"]).float().mean()
        self.amp_grad_scaler.scale(loss).backward()
        self.amp_grad_scaler.step(optimizer)
        self.amp_grad_scaler.update()
        return loss
