"""How the model and the data are spread over ranks: DDP or FSDP2 wrapping, and each rank's share of
the global batch."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ampkit.compat import fsdp2
from ampkit.distributed.group import active
from ampkit.device import Device
from ampkit.errors import UsageError
from ampkit.device.policy import Precision
from ampkit.tasks import map_tensors

__all__ = ["STRATEGIES", "mp_policy", "wrap_model", "unwrap", "shard_batch"]

STRATEGIES = ("ddp", "fsdp")
ShardFn = Callable[[nn.Module, Callable[[nn.Module], Any]], None]


def mp_policy(precision: Precision) -> Any:
    """FSDP2's policy for a precision: params gathered in the low dtype, gradients reduced in FP32."""
    _, MixedPrecisionPolicy = fsdp2()
    if precision.is_low_precision:
        return MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(reduce_dtype=torch.float32)


def wrap_model(model: nn.Module, strategy: str, precision: Precision, device: Device, *,
               shard_fn: ShardFn | None = None) -> nn.Module:
    """DDP, or FSDP2 (``fully_shard`` per entry of ``model.blocks``, then the root).

    ``shard_fn(model, shard)`` replaces the per-block default for a user's model: call ``shard(m)`` on
    each submodule to shard separately (the root is sharded afterwards). Without a process group
    (one process, no torchrun) the model is returned unchanged.
    """
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if not active():
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.is_accelerator and device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _ = fsdp2()
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    policy = mp_policy(precision)

    def shard(module: nn.Module) -> Any:
        return fully_shard(module, mesh=mesh, mp_policy=policy)

    if shard_fn is not None:
        shard_fn(model, shard)
    else:
        for block in getattr(model, "blocks", None) or []:
            shard(block)
    shard(model)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP (FSDP2 shards in place: the model is its own module)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def shard_batch(batch: Any, rank: int, world: int) -> Any:
    """Rows ``rank::world`` of every tensor in the global batch (batch-first tensors; tuples, lists and
    dicts of them, nested; anything else is passed through)."""
    if world == 1:
        return batch
    return map_tensors(batch, lambda t: _rows(t, rank, world))


def _rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    rows = t.shape[0] if t.dim() else 0
    if rows % world or not rows:
        good = rows - rows % world + world
        raise UsageError(f"the global batch has {rows} rows, which {world} ranks cannot share equally: make the "
                         f"task's batch size a multiple of {world} (e.g. --task-arg batch_size={good})")
    return t[rank::world]
