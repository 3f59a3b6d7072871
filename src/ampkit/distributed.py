"""DDP and FSDP2 on PyTorch's own distributed engine, launched by ``torchrun``.

ampkit writes no launcher and no collective: ``torchrun`` starts one process per device (and
restarts them with ``--max-restarts``), this module reads its environment, joins the process
group with the backend the device layer names (nccl, mccl, gloo), and wraps the model:

>>> ctx = init_from_env()                      # None when not started by torchrun  # doctest: +SKIP
>>> model = wrap_model(model, "fsdp", precision, ctx.device)                        # doctest: +SKIP
>>> amp = MixedPrecision(precision, agree=ctx.agree)   # every rank takes the same skip decision  # doctest: +SKIP

Data: the task's ``batch(step)`` is the *global* batch; rank ``r`` of ``w`` trains on rows
``r::w`` of it (:func:`shard_batch`), so the gradient averaged over ranks, and the loss averaged
over ranks for the log, equal a single process's on the whole batch.

Checkpoints: DDP keeps ampkit's one-file format (rank 0 writes, every rank reads).
FSDP2 writes ``step-XXXXXXXX.dcp/`` folders through ``torch.distributed.checkpoint``
(every rank writes its shards; the folder is written under a temporary name and renamed when
complete), which load on any number of ranks, or in one process without a process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ampkit.checkpoint import (FORMAT, CheckpointManager, atomic_write_bytes, fsync_dir, load_checkpoint, restore,
                               restore_engine, rng_state)
from ampkit.device import Device, detect_device
from ampkit.errors import CheckpointError, DeviceError, UsageError
from ampkit.policy import Precision

__all__ = ["STRATEGIES", "DistContext", "launched", "init_from_env", "check_collectives", "wrap_model",
           "unwrap", "mp_policy", "agree_found_inf", "shard_batch", "RunCheckpoints", "torchrun_argv"]

STRATEGIES = ("ddp", "fsdp")
ShardFn = Callable[[nn.Module, Callable[[nn.Module], Any]], None]


def launched() -> bool:
    """True inside a process that ``torchrun`` started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: rank, world size, its device and the collective backend."""

    rank: int
    world_size: int
    local_rank: int
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
        if _active():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t.tolist()

    def barrier(self) -> None:
        if _active():
            torch.distributed.barrier()

    def close(self) -> None:
        if self.owns_group and _active():
            torch.distributed.destroy_process_group()


def _active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_collectives(device: Device) -> None:
    """Refuse, with the card's name, a device whose vendor stack has no collective library."""
    if not device.is_accelerator:
        return
    from ampkit.hardware import capabilities

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
    if not _active():
        # torchrun keeps one TCP store for all restarts of a job (rendezvous store sharing), so the keys
        # that the previous attempt's ranks published (gloo's listening addresses, ...) are still there
        # and the new ranks would connect to dead processes. A prefix per attempt keeps them apart.
        store, _, _ = next(torch.distributed.rendezvous("env://"))
        store = torch.distributed.PrefixStore(f"ampkit/attempt-{restart}", store)
        torch.distributed.init_process_group(backend=dev.collective_backend, store=store, rank=rank,
                                             world_size=world)
        owns = True
    return DistContext(rank=rank, world_size=world, local_rank=local, device=dev, backend=dev.collective_backend,
                       restart_count=restart, owns_group=owns)


def agree_found_inf(found: torch.Tensor) -> torch.Tensor:
    """MAX of the skip flag over ranks, in place: one rank's non-finite gradient makes every rank skip.

    An all_reduce of a device tensor is queued on the device like any kernel: no host sync.
    """
    if _active() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
    return found


def shard_batch(batch: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """Rows ``rank::world`` of every tensor in the global batch (all tensors are batch-first)."""
    if world == 1:
        return batch
    rows = batch[0].shape[0]
    if rows % world:
        raise UsageError(f"the global batch has {rows} rows, which {world} ranks cannot share equally: make the "
                         f"task's batch size a multiple of {world} (e.g. --task-arg batch_size={rows - rows % world + world})")
    return tuple(t[rank::world] for t in batch)


# ---------------------------------------------------------------------------- wrapping
def mp_policy(precision: Precision) -> Any:
    """FSDP2's policy for a precision: params gathered in the low dtype, gradients reduced in FP32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

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
    if not _active():
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.is_accelerator and device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

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


# ---------------------------------------------------------------------------- checkpoints
def _dcp_name(step: int) -> str:
    return f"step-{step:08d}.dcp"


def _is_complete_dcp(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file() and (path / "ampkit.pt").is_file()


class RunCheckpoints:
    """Checkpoints of a (possibly) distributed run, in one folder.

    ``sharded=False``: ampkit's ``step-XXXXXXXX.pt`` files, written by rank 0 only.
    ``sharded=True``: ``step-XXXXXXXX.dcp/`` folders (``torch.distributed.checkpoint`` shards plus
    ``ampkit.pt`` with the engine, RNG, step), written under ``.step-XXXXXXXX.dcp.tmp`` and renamed
    when every rank has written. Resuming reads the newest complete checkpoint of either kind
    (a ``.pt`` file cannot feed a sharded model; it is skipped with a note).
    """

    def __init__(self, folder: str | os.PathLike, *, keep: int = 3, ctx: DistContext | None = None,
                 sharded: bool = False) -> None:
        self.files = CheckpointManager(folder, keep=keep)
        self.folder = Path(folder)
        self.keep = keep
        self.ctx = ctx
        self.sharded = sharded

    @property
    def _main(self) -> bool:
        return self.ctx is None or self.ctx.is_main

    def _barrier(self) -> None:
        if self.ctx is not None:
            self.ctx.barrier()

    def list(self) -> list[tuple[int, Path]]:
        """Complete checkpoints of this run's kind, oldest first."""
        return self._dcp_list() if self.sharded else self.files.list()

    def _dcp_list(self) -> list[tuple[int, Path]]:
        """Complete ``step-XXXXXXXX.dcp`` folders, oldest first."""
        if not self.folder.is_dir():
            return []
        out = []
        for p in self.folder.iterdir():
            if p.name.startswith("step-") and p.name.endswith(".dcp") and _is_complete_dcp(p):
                try:
                    out.append((int(p.name[5:-4]), p))
                except ValueError:
                    continue
        return sorted(out)

    def save(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any, device: Device,
             extra: dict[str, Any] | None = None) -> Path:
        if not self.sharded:
            path = self.files.path_for(step)
            if self._main:
                path = self.files.save(step=step, model=unwrap(model), optimizer=optimizer, amp=amp, device=device,
                                       extra=extra)
            self._barrier()
            return path
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = self.folder / _dcp_name(step)
        tmp = self.folder / f".{_dcp_name(step)}.tmp"
        if self._main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed mid-save
            tmp.mkdir(parents=True)
        self._barrier()
        msd, osd = get_state_dict(model, optimizer)
        try:
            with _quiet_without_group():
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
        except Exception as exc:  # noqa: BLE001 - dcp wraps OSErrors of any rank in its own type
            raise CheckpointError(f"cannot write checkpoint {final}: {str(exc).splitlines()[0][:200]}") from exc
        if self._main:
            state = {"format": FORMAT, "version": 1, "step": int(step), "kind": "dcp",
                     "amp": amp.state_dict() if amp is not None else None, "rng": rng_state(device),
                     "extra": extra or {}, "world_size": self.ctx.world_size if self.ctx else 1}
            atomic_write_bytes(tmp / "ampkit.pt", lambda fh: torch.save(state, fh))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.folder)
            for _, old in self.list()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        self._barrier()
        return final

    def candidates(self) -> list[tuple[int, Path]]:
        """Every checkpoint of either kind, newest first (incomplete ``.dcp`` folders left out)."""
        found = self.files.list() + self._dcp_list()
        # Same step in both kinds: prefer the run's own kind.
        return sorted(found, key=lambda sp: (sp[0], sp[1].suffix == (".dcp" if self.sharded else ".pt")),
                      reverse=True)

    def restore_latest(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any,
                       device: Device) -> tuple[int, Path | None, list[str]]:
        """Load the newest good checkpoint into the live objects: ``(step, path or None, notes)``."""
        notes: list[str] = []
        for step, path in self.candidates():
            if path.suffix == ".pt":
                if self.sharded:
                    notes.append(f"skipped {path.name}: a one-file checkpoint cannot feed a sharded (fsdp) model")
                    continue
                try:
                    state = load_checkpoint(path, map_location=device.torch_device)
                except CheckpointError as exc:
                    notes.append(f"skipped unreadable checkpoint: {exc}")
                    continue
                notes += restore(state, model=unwrap(model), optimizer=optimizer, amp=amp, device=device).notes
                return int(state["step"]), path, notes
            try:
                meta = _load_meta(path / "ampkit.pt", device)
            except CheckpointError as exc:
                notes.append(f"skipped unreadable checkpoint: {exc}")
                continue
            _load_dcp(path, model, optimizer)
            notes += restore_engine(meta, amp=amp, device=device)
            saved_world = meta.get("world_size", 1)
            world = self.ctx.world_size if self.ctx else 1
            if saved_world != world:
                notes.append(f"checkpoint written by {saved_world} rank(s), resharded onto {world}")
            return int(meta["step"]), path, notes
        return 0, None, notes


def _load_meta(path: Path, device: Device) -> dict[str, Any]:
    state = load_checkpoint(path, map_location=device.torch_device)
    if state.get("kind") != "dcp":
        raise CheckpointError(f"{path} is not the metadata of a sharded checkpoint")
    return state


def _load_dcp(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    target = unwrap(model)
    msd, osd = get_state_dict(target, optimizer)
    state = {"model": msd, "optim": osd}
    try:
        with _quiet_without_group():
            dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # noqa: BLE001 - every rank reads the same files: all fail alike
        raise CheckpointError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0][:200]}") from exc
    set_state_dict(target, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


@contextmanager
def _quiet_without_group() -> Iterator[None]:
    """dcp warns that it assumes one process when there is no process group: that is what we mean."""
    with warnings.catch_warnings():
        if not _active():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


# ---------------------------------------------------------------------------- metrics on resume
def truncate_metrics(path: Path, step: int) -> int:
    """Keep the records of ``path`` up to ``step`` (a restart resumes there: no step is logged twice).

    Returns how many lines were dropped (records past ``step`` and a torn last line).
    """
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ok = int(json.loads(line)["step"]) <= step
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        data = "".join(line + "\n" for line in kept).encode()
        atomic_write_bytes(path, lambda fh: fh.write(data))
    return dropped


# ---------------------------------------------------------------------------- launching
def torchrun_argv(nproc: int, train_args: list[str], *, max_restarts: int = 0) -> list[str]:
    """The one-node torchrun command that ``ampkit train --nproc N`` execs."""
    import sys

    if nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", str(max_restarts), "-m", "ampkit", "train", *train_args]


# ---------------------------------------------------------------------------- test hooks
class TestHooks:
    """Fault injection for ampkit's own tests, off unless its environment variables are set.

    ``AMPKIT_TEST_KILL_AT_STEP=K`` (+ ``AMPKIT_TEST_KILL_RANK``, default 1): that rank SIGKILLs itself
    right after optimizer step K, once per ``--out`` (a marker file remembers it).
    ``AMPKIT_TEST_INF_AT_STEP=K`` (+ ``AMPKIT_TEST_INF_RANK``, default the last rank): that rank puts an
    inf into one of its gradients before step K, after backward (after DDP's all-reduce).
    ``AMPKIT_TEST_DUMP=DIR``: every rank writes ``DIR/rank<R>.json`` with what it ended with.
    """

    __test__ = False  # not a pytest class

    def __init__(self, rank: int, world: int, out: Path | None) -> None:
        env = os.environ
        self.rank = rank
        self.kill_at = int(env["AMPKIT_TEST_KILL_AT_STEP"]) if env.get("AMPKIT_TEST_KILL_AT_STEP") else None
        self.kill_rank = int(env.get("AMPKIT_TEST_KILL_RANK", "1"))
        self.inf_at = int(env["AMPKIT_TEST_INF_AT_STEP"]) if env.get("AMPKIT_TEST_INF_AT_STEP") else None
        self.inf_rank = int(env.get("AMPKIT_TEST_INF_RANK", str(world - 1)))
        self.dump = env.get("AMPKIT_TEST_DUMP") or None
        self.marker = (out / ".ampkit-test-killed") if out is not None else None

    @classmethod
    def from_env(cls, rank: int, world: int, out: Path | None) -> "TestHooks | None":
        keys = ("AMPKIT_TEST_KILL_AT_STEP", "AMPKIT_TEST_INF_AT_STEP", "AMPKIT_TEST_DUMP")
        return cls(rank, world, out) if any(os.environ.get(k) for k in keys) else None

    def before_step(self, step: int, model: nn.Module) -> None:
        """``step``: the 1-based number of the optimizer step about to run."""
        if self.inf_at != step or self.rank != self.inf_rank:
            return
        for p in model.parameters():
            g = p.grad
            local = g.to_local() if g is not None and hasattr(g, "to_local") else g
            if local is not None and local.numel():
                with torch.no_grad():
                    local.view(-1)[0] = float("inf")
                return

    def after_step(self, step: int) -> None:
        if self.kill_at == step and self.rank == self.kill_rank and self.marker is not None \
                and not self.marker.exists():
            self.marker.write_text(str(step))
            os.kill(os.getpid(), signal.SIGKILL)

    def finish(self, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Any) -> None:
        if self.dump is None:
            return
        stats = amp.stats() if amp.steps else {"skipped": 0, "scale": 1.0}
        local = [(p.to_local() if hasattr(p, "to_local") else p).detach().double() for p in model.parameters()]
        steps = sorted({float(s["step"]) for s in optimizer.state.values() if "step" in s})
        record = {"rank": self.rank, "skipped": stats["skipped"], "scale": stats["scale"], "optimizer_steps": steps,
                  "param_sum": float(sum(t.sum() for t in local)), "param_abs_sum": float(sum(t.abs().sum() for t in local))}
        Path(self.dump).mkdir(parents=True, exist_ok=True)
        (Path(self.dump) / f"rank{self.rank}.json").write_text(json.dumps(record))
