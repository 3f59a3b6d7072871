"""This process's place in a ``torchrun`` job: the process group, its rank and device, and the few
collectives the trainer uses (skip agreement, log sums, the stop flag, barriers)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ampkit.device import Device, detect_device
from ampkit.errors import DeviceError, UsageError

__all__ = ["DistContext", "launched", "active", "init_from_env", "check_collectives", "agree_found_inf"]


def launched() -> bool:
    """True inside a process that ``torchrun`` started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: rank, world size, its device and the collective backend."""

    rank: int
    world_size: int
    device: Device
    backend: str
    restart_count: int = 0
    owns_group: bool = False  # True when init_from_env created the process group (and should end it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, found: torch.Tensor) -> torch.Tensor:
        """:func:`agree_found_inf` on this job's group."""
        return agree_found_inf(found)

    def reduce_sum(self, values: list[float]) -> list[float]:
        """Sum a few numbers over ranks in one all_reduce (used once per log step)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device.torch_device)
        if active():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t.tolist()

    def max_(self, flag: torch.Tensor) -> torch.Tensor:
        """MAX of a device tensor over ranks, in place: queued on the device, no host read."""
        if active() and self.world_size > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag

    def barrier(self) -> None:
        if active():
            torch.distributed.barrier()

    def close(self, finished: bool = False) -> None:
        """Tear the group down. ``finished``: every rank ended the run normally, so they first meet at a barrier
        (gloo can abort a process whose peer closes the connection under a collective still in flight); after
        an error on one rank there is no barrier, which the others might never reach."""
        if self.owns_group and active():
            if finished:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_collectives(device: Device) -> None:
    """Refuse, with the card's name, a device whose vendor stack has no collective library."""
    if not device.is_accelerator:
        return
    from ampkit.device.hardware import capabilities

    caps = capabilities(device, probe=False)
    if caps.collectives.supported is False:
        raise DeviceError(
            f"{caps.name} has no {device.collective_backend} (the multi-device collective library) for its "
            f"architecture{f' {caps.arch}' if caps.arch else ''}: distributed training (torchrun, --nproc, "
            "--strategy) is not supported on this card. Train on one card: run `ampkit train` without "
            "torchrun/--nproc; `ampkit doctor` lists what the card supports"
        )


def init_from_env(device: Device | None = None) -> DistContext | None:
    """Join the process group that ``torchrun`` describes; None when not launched by torchrun.

    Picks ``Device(type, LOCAL_RANK)`` (the CPU has no index), makes it current, and calls
    ``init_process_group`` with the device layer's collective backend (gloo on the CPU).
    """
    if not launched():
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as exc:
        raise UsageError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {exc}") from exc
    base = device or detect_device()
    counted = base.is_accelerator and hasattr(base.module, "device_count")  # one device per local rank
    dev = Device(base.type, local if counted else base.index)
    check_collectives(dev)
    if counted:
        count = dev.module.device_count()
        if local >= count:
            raise DeviceError(f"local rank {local} has no {dev.type} device: this node has {count}; start at most "
                              f"{count} processes per node (torchrun --nproc-per-node {count})")
    dev.set_current()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    owns = False
    if not active():
        # torchrun keeps one TCP store for all restarts of a job (rendezvous store sharing), so the keys
        # that the previous attempt's ranks published (gloo's listening addresses, ...) are still there
        # and the new ranks would connect to dead processes. A prefix per attempt keeps them apart.
        store, _, _ = next(torch.distributed.rendezvous("env://"))
        store = torch.distributed.PrefixStore(f"ampkit/attempt-{restart}", store)
        torch.distributed.init_process_group(backend=dev.collective_backend, store=store, rank=rank,
                                             world_size=world)
        owns = True
    return DistContext(rank=rank, world_size=world, device=dev, backend=dev.collective_backend,
                       restart_count=restart, owns_group=owns)


def agree_found_inf(found: torch.Tensor) -> torch.Tensor:
    """MAX of the skip flag over ranks, in place: one rank's non-finite gradient makes every rank skip.

    An all_reduce of a device tensor is queued on the device like any kernel: no host sync.
    """
    if active() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
    return found
