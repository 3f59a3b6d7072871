"""BF16 weights with exact updates: ``MixedPrecision("bf16", weights="bf16")``.

>>> amp = ampkit.MixedPrecision("bf16", weights="bf16", device="cpu")
>>> model = torch.nn.Linear(4, 2)
>>> _ = amp.attach(model)                        # the weights become BF16, each with a 16-bit remainder
>>> model.weight.dtype
torch.bfloat16

Each FP32 weight is split into its BF16 rounding (the parameter the model computes with) and a 16-bit
remainder (an int16 tensor the engine keeps), so that the pair is the FP32 value, bit for bit: a parameter
takes 2 + 2 bytes instead of 4, and the forward and backward run on BF16 weights with no per-step cast.
At each optimizer step the engine joins the pair into the exact FP32 value, hands the optimizer FP32
parameters and FP32 gradients (so its states are FP32 and it updates the FP32 value, as with a separate master
copy), and splits the result again. TransformerEngine's FusedAdam (``store_param_remainders``) stores its
master weights the same way.

Why it is built this way:

* The split rounds half away from zero (the low 16 bits >= 0x8000 round the magnitude up), as TransformerEngine
  does: the remainder is then the low 16 bits as a signed int16 and the pair maps back to the exact FP32 value.
  Rounding half to even (what ``tensor.to(torch.bfloat16)`` does) cannot be undone with 16 bits: on an exact tie
  both neighbours need the same remainder. The two roundings differ only on exact ties (the low 16 bits exactly
  0x8000).
* The BF16 tensor keeps its storage from step to step (the new rounding is copied into it): what holds a
  reference to the weights (a compiled graph, a hook) keeps seeing them.
* ``weights="bf16-pure"`` is the memory-saving configuration people use without ampkit (``model.to(bfloat16)``,
  the optimizer stepping BF16 weights, no master copy), offered so that ``ampkit compare`` can measure its harm;
  it is never chosen for you.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ampkit.errors import UsageError

__all__ = ["MasterWeights", "split", "join"]


if sys.byteorder != "little":  # pragma: no cover - torch runs on little-endian machines only
    raise ImportError("ampkit.engine.master reads FP32 bits as two int16 halves: a little-endian machine is needed")


def split(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(BF16 rounding, int16 remainder) of an FP32 tensor; :func:`join` gives the FP32 value back exactly.

    In 16-bit integer arithmetic only (two bytes per element at a time): an FP32 value is the pair (low half,
    high half) of its bits, read in place as two int16 (little-endian, as on every platform torch runs on)."""
    if value.dtype != torch.float32:
        raise UsageError(f"split takes an FP32 tensor, got {value.dtype}")
    halves = value.contiguous().reshape(-1).view(torch.int16).view(-1, 2)
    low, high = halves[:, 0], halves[:, 1]
    up = (low < 0).to(torch.int16)  # the dropped 16 bits are >= 0x8000: round the magnitude up (ties away from 0)
    rounded = (high + up).reshape(value.shape)  # int16 arithmetic wraps: 0x7fff + 1 gives the bits 0x8000
    return rounded.view(torch.bfloat16), low.reshape(value.shape).clone()


def join(high: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The FP32 tensor whose :func:`split` is ``(high, remainder)``."""
    h = high.reshape(-1).view(torch.int16) - (remainder.reshape(-1) < 0).to(torch.int16)
    pair = torch.stack((remainder.reshape(-1), h), dim=-1)
    return pair.view(torch.int32).view(torch.float32).reshape(high.shape)


class MasterWeights:
    """The remainders of a model whose floating-point parameters were split by :meth:`convert`.

    ``exact(params)`` is the window in which those parameters (and their gradients) are the exact FP32 values;
    on leaving it, the parameters are split again. Made by :meth:`ampkit.MixedPrecision.attach`.
    """

    def __init__(self) -> None:
        self._rem: dict[int, torch.Tensor] = {}  # id(param) -> int16 remainder
        self._names: dict[int, str] = {}
        self._params: dict[int, nn.Parameter] = {}

    @classmethod
    def convert(cls, model: nn.Module, *, pure: bool = False) -> "MasterWeights":
        """Turn every FP32 parameter of ``model`` into BF16 in place (the same Parameter objects, so an optimizer
        made before keeps them), keeping remainders unless ``pure``. Buffers stay as they are."""
        self = cls()
        for name, p in model.named_parameters():
            if p.dtype != torch.float32:
                continue
            if p.grad is not None:
                raise UsageError(f"parameter {name} has a gradient: call amp.attach(model) before training")
            high, rem = split(p.detach())
            p.data = high
            if not pure:
                self._rem[id(p)], self._names[id(p)], self._params[id(p)] = rem, name, p
        return self

    def covers(self, param: torch.Tensor) -> bool:
        return id(param) in self._rem

    @property
    def remainder_bytes(self) -> int:
        return sum(r.numel() * r.element_size() for r in self._rem.values())

    @contextlib.contextmanager
    def exact(self, params: Sequence[torch.Tensor] | None = None, *, keep_grads: bool = True) -> Iterator[None]:
        """Within the block the covered ``params`` (default: all) are their exact FP32 values, their gradients
        FP32; after it, each is split again into its BF16 storage and remainder, and its gradient is BF16 again
        (or dropped: ``keep_grads=False``, as ``zero_grad(set_to_none=True)`` would)."""
        chosen = [p for p in (params if params is not None else self._params.values()) if id(p) in self._rem]
        held: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            for p in chosen:
                grad, low = p.grad, p.data
                p.grad = None
                p.data = join(low, self._rem[id(p)])
                held.append((p, low))
                if grad is not None:
                    p.grad = grad.float()
            yield
        finally:
            for p, low in held:
                grad = p.grad
                p.grad = None
                high, rem = split(p.data)
                low.copy_(high)
                self._rem[id(p)].copy_(rem)
                p.data = low
                if grad is not None and keep_grads:
                    p.grad = grad.to(torch.bfloat16)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{parameter name: int16 remainder}`` (the parameters' BF16 values are in the model's state_dict)."""
        return {self._names[k]: r for k, r in self._rem.items()}

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Put saved remainders back; returns notes for names that do not match."""
        by_name = {n: k for k, n in self._names.items()}
        missing = sorted(set(by_name) - set(state))
        for name, rem in state.items():
            key = by_name.get(name)
            if key is not None and tuple(rem.shape) == tuple(self._rem[key].shape):
                self._rem[key].copy_(rem.to(self._rem[key].device))
        if missing:
            return [f"the checkpoint has no BF16 remainder for {len(missing)} parameter(s) (e.g. {missing[0]}): "
                    "those continue from their BF16 values"]
        return []
