"""What ``ampkit bench`` trains: a model on the device, its initial weights, a loss and fixed batches.

Names: ``gpt2-small`` (charlm in the GPT-2-small shape; accelerators only), ``charlm``, ``digits``,
``lesson`` (the lesson's 5-4-3 ``SimpleModel`` with MSE on one fixed 6x5 batch), ``llama-1b`` (a Llama-style
decoder in the TinyLlama-1.1B shape at sequence 2048, :mod:`ampkit.bench.llama`; accelerators only), the foreign models
``resnet50`` (torchvision) and ``hf-gpt2`` (transformers) of :mod:`ampkit.bench.foreign`, or any task spec
``FILE.py:factory`` / ``module:factory`` (see :func:`ampkit.tasks.load_task`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.bench.foreign import FOREIGN, build_foreign
from ampkit.bench.llama import build_llama
from ampkit.device import Device
from ampkit.errors import UsageError

__all__ = ["Workload", "load_workload", "fp8_copy", "SimpleModel", "GPT2_SMALL", "MODEL_NAMES"]

# GPT-2 small: 124M parameters with the vocabulary padded from 50257 to 50304 (a multiple of 64, so
# the head's matmul tiles evenly), 16 sequences of 1024 tokens.
GPT2_SMALL = {"d_model": 768, "n_layers": 12, "n_heads": 12, "seq_len": 1024, "batch_size": 16, "vocab_size": 50304}
MODEL_NAMES = ("gpt2-small", "llama-1b", "charlm", "digits", "lesson", "resnet50", "hf-gpt2")
N_BATCHES = 4  # distinct batches cycled through: real data, no transfer inside the timed loop


class SimpleModel(nn.Module):
    """The lesson's model: Linear(5, 4) -> ReLU -> Linear(4, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 4)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


@dataclass(kw_only=True)
class Workload:
    """A model on the device with its initial weights, a loss and batches already on the device."""

    name: str
    description: str
    model: nn.Module
    loss: Callable[[nn.Module, Any], torch.Tensor]
    batches: list[tuple[torch.Tensor, ...]]
    flops_per_step: float | None
    tokens_per_step: int | None
    samples_per_step: int
    lr: float
    weight_decay: float
    n_params: int = 0
    initial_state: dict[str, torch.Tensor] = field(default_factory=dict)
    # The optimizer every runner builds: ``make_optimizer(params, **flags)`` (flags: fused, capturable).
    # None: AdamW with the workload's lr and weight decay.
    make_optimizer: Callable[..., torch.optim.Optimizer] | None = None
    optimizer_name: str = "AdamW (fused where the device has it)"

    def optimizer(self, params: Any, **flags: Any) -> torch.optim.Optimizer:
        """This workload's optimizer over ``params`` (``flags``: fused, capturable, foreach)."""
        if self.make_optimizer is not None:
            return self.make_optimizer(params, **flags)
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, **flags)

    def reset(self) -> None:
        """Initial weights back, no gradients: every runner starts from the same model."""
        with torch.no_grad():
            self.model.load_state_dict(self.initial_state)
        for p in self.model.parameters():
            p.grad = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "n_params": self.n_params,
                "flops_per_step": self.flops_per_step, "tokens_per_step": self.tokens_per_step,
                "samples_per_step": self.samples_per_step, "batch_shapes": [list(t.shape) for t in self.batches[0]],
                "optimizer": self.optimizer_name}


def _lesson(device: Device, seed: int) -> Workload:
    torch.manual_seed(seed)
    model = SimpleModel()
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(m(b[0]), b[1])

    macs = 5 * 4 + 4 * 3
    return Workload(name="lesson", model=model, loss=loss, batches=[(x, y)], flops_per_step=3 * 2 * macs * 6.0,
                    tokens_per_step=None, samples_per_step=6, lr=1e-3, weight_decay=0.01,
                    description="the lesson's SimpleModel (Linear 5->4, ReLU, Linear 4->3), MSE, one fixed 6x5 batch")


def load_workload(spec: str, device: Device, *, seed: int = 0, options: dict[str, Any] | None = None) -> Workload:
    """Build the workload ``spec`` on ``device`` (weights seeded by ``seed``; ``options`` go to the task)."""
    from ampkit.tasks import load_task

    options = dict(options or {})
    if spec == "gpt2-small":
        if not device.is_accelerator:
            raise UsageError("gpt2-small (124M parameters, 16 x 1024 tokens a step) needs a GPU: on the CPU use "
                             "--model charlm (or --model digits)")
        task = load_task("charlm", seed=seed, options={**GPT2_SMALL, **options}, device=device.torch_device)
        wl = _from_task(task, "gpt2-small")
        wl.description = "GPT-2 small shape: " + task.description
    elif spec == "llama-1b":
        if not device.is_accelerator and not options:
            raise UsageError("llama-1b (1.1B parameters, 8 x 2048 tokens a step) needs a GPU: on the CPU shrink it "
                             "(--task-arg d_model=64 --task-arg n_layers=2 ...) or use --model charlm")
        torch.manual_seed(seed)
        wl = Workload(name=spec, **build_llama(options, torch.Generator().manual_seed(seed)))
    elif spec in FOREIGN:
        wl = Workload(name=spec, **build_foreign(spec, device, seed, options))
    elif spec == "lesson":
        if options:
            raise UsageError(f"--model lesson takes no options (got {', '.join(options)})")
        wl = _lesson(device, seed)
    else:
        wl = _from_task(load_task(spec, seed=seed, options=options, device=device.torch_device), spec)
    dev = device.torch_device
    wl.model.to(dev)
    wl.model.train()
    wl.n_params = sum(p.numel() for p in wl.model.parameters())
    # On the host: a copy on the device would inflate every runner's peak memory.
    wl.initial_state = {k: v.detach().to("cpu", copy=True) for k, v in wl.model.state_dict().items()}
    wl.batches = [tuple(t.to(dev) for t in b) for b in wl.batches]  # .to keeps channels_last strides
    return wl


def _from_task(task: Any, name: str) -> Workload:
    batches = [tuple(task.batch(i)) for i in range(N_BATCHES)]
    return Workload(name=name, description=task.description, model=task.model, loss=task.loss, batches=batches,
                    flops_per_step=task.flops_per_step, tokens_per_step=task.tokens_per_batch,
                    samples_per_step=task.samples_per_batch, lr=task.lr, weight_decay=task.weight_decay)


def fp8_copy(wl: Workload, recipe: str, chosen: Any = None) -> tuple[Workload, str]:
    """The workload with a copy of its model whose chosen ``nn.Linear`` layers are torchao's ``Float8Linear``
    (:func:`ampkit.engine.fp8.convert`): the same initial weights (the state dict keys do not change) and batches, so
    the FP8 rows time the same training as the others; ``wl`` itself is left as it was. ``chosen``: the FP8 plan
    (an :class:`~ampkit.engine.fp8.FP8Report` made for ``wl.model``) to convert; None: the shape filter's.
    Returns the copy and the conversion's one-line summary."""
    from ampkit.engine.fp8 import convert

    model = copy.deepcopy(wl.model)
    report = convert(model, recipe=recipe, chosen=chosen)
    out = dataclasses.replace(wl, model=model)
    out.reset()
    return out, report.summary()
