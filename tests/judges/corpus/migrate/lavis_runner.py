# Modelled on salesforce/LAVIS lavis/runners/runner_base.py and lavis/tasks/base_task.py (BSD-3-Clause):
# the device read from the run config, a lazily made torch.cuda.amp GradScaler, autocast through
# torch.cuda.amp, cache emptied after evaluation. Written for ampkit's judge corpus.
import torch

RUN_CFG = {"device": "cuda", "amp": True, "dist_backend": "nccl", "gpu": 0}


class RunnerBase:
    def __init__(self, run_cfg=RUN_CFG):
        self.run_cfg = run_cfg
        self._device = None
        self._scaler = None

    @property
    def device(self):
        if self._device is None:
            self._device = torch.device(self.run_cfg["device"])
        return self._device

    @property
    def scaler(self):
        if self.run_cfg.get("amp", False) and self._scaler is None:
            self._scaler = torch.cuda.amp.GradScaler()
        return self._scaler

    def train_step(self, model, samples, optimizer):
        use_amp = self.scaler is not None
        with torch.cuda.amp.autocast(enabled=use_amp):
            loss = model(samples)["loss"]
        if use_amp:
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()
        return loss

    def evaluate(self, model, data):
        results = [model(samples.to(self.device)) for samples in data]
        torch.cuda.empty_cache()
        return results
