"""Workloads from the libraries people train with, for ``ampkit bench --model``: models nobody here wrote.

* ``resnet50``: torchvision's ResNet-50 (no pretrained weights), channels_last, SGD with momentum 0.9,
  128 images of 224x224 a step (``pip install ampkit[vision]``).
* ``hf-gpt2``: Hugging Face transformers' ``GPT2LMHeadModel`` built from a ``GPT2Config`` (124M, no download),
  16 sequences of 1024 tokens, fused AdamW (``pip install ampkit[hf]``).

The inputs are synthetic (random images and tokens, seeded): these workloads measure speed, and the
step's cost does not depend on the pixel values. ResNet-50's learning rate is 0.02: at 0.1 its FP16
run on random labels overflows for good after ~70 steps, and a run of skipped steps times nothing real. Each option can be changed with ``--task-arg``
(e.g. ``--task-arg batch_size=32``), so the CPU tests run the same code at a tiny size.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.device import Device
from ampkit.errors import UsageError, first_line

__all__ = ["FOREIGN", "build_foreign"]

RESNET50 = {"batch_size": 128, "image_size": 224, "num_classes": 1000, "lr": 0.02, "momentum": 0.9,
            "weight_decay": 1e-4, "channels_last": True}
HF_GPT2 = {"batch_size": 16, "seq_len": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
           "lr": 6e-4, "weight_decay": 0.1}
SIZE_OPTIONS = {"batch_size", "seq_len", "image_size", "n_layer", "n_embd"}  # any of them: the user sized it
CPU_HINT = {"resnet50": "--task-arg batch_size=4 --task-arg image_size=64",
            "hf-gpt2": "--task-arg batch_size=2 --task-arg seq_len=128 --task-arg n_layer=2"}
FOREIGN = {"resnet50": ("torchvision", "vision", RESNET50), "hf-gpt2": ("transformers", "hf", HF_GPT2)}


def _size(name: str, o: dict[str, Any]) -> str:
    if name == "resnet50":
        return f"{o['batch_size']} images of {o['image_size']}x{o['image_size']} a step"
    return f"{o['batch_size']} x {o['seq_len']} tokens a step, {o['n_layer']} layers"


def _import(module: str, extra: str, model: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install (e.g. a torchvision built for another torch) too
        raise UsageError(f"--model {model} needs {module}: pip install 'ampkit[{extra}]' ({first_line(exc)})") from None


def _options(defaults: dict[str, Any], options: dict[str, Any], model: str) -> dict[str, Any]:
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise UsageError(f"--model {model} has no option {', '.join(unknown)}: it takes {', '.join(defaults)}")
    return {**defaults, **options}


def build_foreign(name: str, device: Device, seed: int, options: dict[str, Any]) -> dict[str, Any]:
    """The parts of a :class:`~ampkit.bench.workloads.Workload` for foreign model ``name`` (on the host)."""
    module, extra, defaults = FOREIGN[name]
    lib = _import(module, extra, name)
    opts = _options(defaults, options, name)
    if not device.is_accelerator and not set(options) & SIZE_OPTIONS:
        # Sized for a GPU: hf-gpt2's 16 x 1024 tokens grew past 19 GB on the CPU, in minutes per step.
        raise UsageError(f"--model {name} is sized for a GPU ({_size(name, opts)}), far too large for the CPU: "
                         f"size it down, e.g. {CPU_HINT[name]}, or run on an accelerator")
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    return (_resnet50 if name == "resnet50" else _hf_gpt2)(lib, opts, g)


def _resnet50(torchvision: Any, o: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    model = torchvision.models.resnet50(weights=None, num_classes=o["num_classes"])
    b, s = o["batch_size"], o["image_size"]
    fmt = torch.channels_last if o["channels_last"] else torch.contiguous_format
    if o["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    batches = [(torch.randn(b, 3, s, s, generator=g).contiguous(memory_format=fmt),
                torch.randint(0, o["num_classes"], (b,), generator=g)) for _ in range(4)]

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(m(batch[0]), batch[1])

    def optimizer(params: Any, **flags: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"], **flags)

    # 4.1 GFLOPs (multiply-adds x 2) per 224x224 forward, scaled by area; backward is twice the forward.
    flops = 3 * 2 * 4.09e9 * b * (s / 224) ** 2
    return {"model": model, "loss": loss, "batches": batches, "flops_per_step": flops, "tokens_per_step": None,
            "samples_per_step": b, "lr": o["lr"], "weight_decay": o["weight_decay"], "make_optimizer": optimizer,
            "optimizer_name": f"SGD (momentum {o['momentum']}, fused where the device has it)",
            "description": f"torchvision ResNet-50, {b} x 3 x {s} x {s} synthetic images"
                           + (", channels_last" if o["channels_last"] else "") + ", SGD with momentum"}


def _hf_gpt2(transformers: Any, o: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    config = transformers.GPT2Config(n_embd=o["n_embd"], n_layer=o["n_layer"], n_head=o["n_head"],
                                     vocab_size=o["vocab_size"], n_positions=max(1024, o["seq_len"]))
    model = transformers.GPT2LMHeadModel(config)
    b, t = o["batch_size"], o["seq_len"]
    batches = [(torch.randint(0, o["vocab_size"], (b, t), generator=g),) for _ in range(4)]

    def loss(m: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
        return m(input_ids=batch[0], labels=batch[0]).loss  # transformers shifts the labels itself

    n = sum(p.numel() for p in model.parameters())
    # 6 N per token for the weights, plus attention's 12 * layers * d * T per token (forward + backward).
    flops = (6 * n + 12 * o["n_layer"] * o["n_embd"] * t) * b * t
    return {"model": model, "loss": loss, "batches": batches, "flops_per_step": float(flops),
            "tokens_per_step": b * t, "samples_per_step": b, "lr": o["lr"], "weight_decay": o["weight_decay"],
            "make_optimizer": None, "optimizer_name": "AdamW (fused where the device has it)",
            "description": f"transformers GPT2LMHeadModel ({n / 1e6:.0f}M, from a config), {b} x {t} tokens"}
