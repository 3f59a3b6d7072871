"""Harms of known size planted in the AMP runs only, on a real built-in task (tests and the calibration benchmark).

``make_task(seed, base="digits", harm="none", **base_options)`` builds the built-in task ``base`` and
changes what happens while autocast is on, i.e. in the AMP runs of ``ampkit compare`` (the FP32 runs
are the task itself):

* ``lr``: the AdamW learning rate is scaled by ``factor`` (default 0.5: "a halved LR");
* ``bias``: the loss (training and evaluated) is ``factor`` times its value (default 1.05: 5 % worse
  for the whole run; AdamW is invariant to the scale of the gradient, so training itself is unchanged);
* ``round``: after every optimizer step the weights are rounded to 7 mantissa bits (BF16 weights
  without FP32 master weights);
* ``labels``: every ``1 / share``-th training label is replaced by the next class (label noise,
  classification only; default share 0.2);
* ``none``: nothing: AMP as it is.
"""

from __future__ import annotations

import torch

import ampkit
from ampkit.tasks import load_task

HARMS = ("none", "lr", "bias", "round", "labels")
DEFAULT_FACTOR = {"lr": 0.5, "bias": 1.05, "labels": 0.2}


def _amp(batch) -> bool:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return torch.is_autocast_enabled(x.device.type)


def make_task(seed: int = 0, base: str = "digits", harm: str = "none", factor: float | None = None,
              device=None, **options) -> ampkit.Task:
    if harm not in HARMS:
        raise ValueError(f"harm must be one of {HARMS}, got {harm!r}")
    task = load_task(base, seed=seed, options={"size": "small", **options} if base == "digits" else options,
                     device=device)
    factor = DEFAULT_FACTOR.get(harm, 1.0) if factor is None else factor
    state = {"amp": False}
    base_loss, base_eval = task.loss, task.evaluate

    def loss(model, b):
        state["amp"] = _amp(b)
        if state["amp"] and harm == "labels":
            x, y = b
            every = max(1, round(1 / factor))
            noisy = torch.where(torch.arange(len(y), device=y.device) % every == 0, (y + 1) % 10, y)
            b = (x, noisy)
        out = base_loss(model, b)
        return out * factor if state["amp"] and harm == "bias" else out

    def evaluate(model, dev):
        metrics = dict(base_eval(model, dev))
        if harm == "bias" and torch.is_autocast_enabled(torch.device(dev).type):
            metrics = {k: v * factor if "loss" in k else v for k, v in metrics.items()}
        return metrics

    def make_optimizer(model):
        opt = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)

        def pre(optimizer, *_):
            for g in optimizer.param_groups:
                g["lr"] = task.lr * (factor if harm == "lr" and state["amp"] else 1.0)

        def post(optimizer, *_):
            if harm == "round" and state["amp"]:
                with torch.no_grad():
                    for p in model.parameters():
                        p.copy_(p.to(torch.bfloat16).to(p.dtype))

        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(post)
        return opt

    task.loss, task.evaluate, task.make_optimizer = loss, evaluate, make_optimizer
    task.name = f"{task.name}+{harm}"
    return task
