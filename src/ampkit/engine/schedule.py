"""LR schedulers that do not advance on skipped steps, without a host read per step.

A scheduler is a Python object: it can only be told "this step was skipped" on the host, and with a
fused optimizer the skip flag lives on the device (reading it every step is the sync ampkit avoids).
So, for the optimizers whose skips stay on the device, :class:`DeviceSchedule` turns the schedule into
data the device can index:

* The learning rate of every parameter group becomes a device tensor: a float ``lr`` is replaced by a
  tensor of the same value (float64 on the CPU, where the fused kernels then compute bit for bit as with
  the float; float32 on accelerators, whose fused kernels read a tensor lr as float32).
* The schedule is evaluated ahead on the host, in chunks (``CHUNK`` steps), by stepping the user's own
  scheduler on stand-in learning rates and restoring it afterwards: ``table[p]`` holds every group's
  learning rate after ``p`` applied steps. Any scheduler whose ``state_dict`` captures its state works
  (LambdaLR, OneCycleLR, SequentialLR, chainable ones); ReduceLROnPlateau needs a metric and is refused.
* Each step the device adds ``1 - skipped`` to its position and copies ``table[position]`` into the
  learning rates: a skipped step leaves both unchanged, exactly as ``if not skipped: scheduler.step()``.
* Schedules that also change other hyperparameters (``OneCycleLR`` / ``CyclicLR`` with
  ``cycle_momentum=True``: momentum, betas) cannot be a table of learning rates: :attr:`moves_other`
  says so and the engine steps those schedulers on the host, after one read of the skip flag per step
  (pass ``cycle_momentum=False`` to keep the step free of host reads).
* The scheduler object itself is brought to the true position (one host read) by :meth:`sync`, which
  the engine calls in ``stats()``, ``state_dict()`` and ``sync_schedulers()``; between those its
  ``last_epoch`` and ``get_last_lr()`` are stale, while the optimizer's learning rates are exact.

Optimizers that skip on the host (non-fused) need no table: the engine already read the flag and steps
the scheduler itself when the step was applied.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from typing import Any

import torch

from ampkit import compat
from ampkit.errors import UsageError
from ampkit.engine.step import is_fused

__all__ = ["Schedules", "DeviceSchedule", "check_scheduler", "CHUNK"]

#: Schedule steps evaluated ahead per host extension of the table.
CHUNK = 256


def check_scheduler(scheduler: Any) -> None:
    """UsageError unless ``scheduler`` is an LR scheduler that steps without arguments."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise UsageError("ReduceLROnPlateau steps on a metric, not per optimizer step: leave it out of "
                         "amp.step(scheduler=...) and call scheduler.step(val_loss) after evaluating")
    if not (callable(getattr(scheduler, "step", None)) and hasattr(scheduler, "optimizer")
            and callable(getattr(scheduler, "state_dict", None))):
        raise UsageError(f"scheduler= takes torch LR schedulers (torch.optim.lr_scheduler.*), got "
                         f"{type(scheduler).__name__}")


def _lr_dtype(device: torch.device) -> torch.dtype:
    # The CPU's fused kernels compute with a double lr: a float64 tensor gives the float lr's results bit for
    # bit. The accelerators' fused kernels read a tensor lr as float32 (and compute in float32).
    return torch.float64 if device.type == "cpu" else torch.float32


def _others(group: dict[str, Any]) -> dict[str, Any]:
    """A group's scalar hyperparameters other than lr (what OneCycleLR / CyclicLR also cycle)."""
    return {k: v for k, v in group.items() if k not in ("params", "lr") and isinstance(v, (int, float, tuple))}


class DeviceSchedule:
    """One scheduler driven by a device-side count of applied steps (see the module docstring)."""

    def __init__(self, scheduler: Any, device: torch.device) -> None:
        self.scheduler = scheduler
        self.device = device
        self.groups = scheduler.optimizer.param_groups
        for group in self.groups:
            lr = group["lr"]
            if not isinstance(lr, torch.Tensor):  # a fill, not a host copy: no sync on an accelerator
                group["lr"] = torch.full((), float(lr), dtype=_lr_dtype(device), device=device)
            elif lr.device != device:
                raise UsageError(f"a tensor learning rate on {lr.device} while training on {device}: "
                                 f"make it with torch.tensor(lr, device={str(device)!r})")
        self.lrs: list[torch.Tensor] = [g["lr"] for g in self.groups]
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        # chunk start -> (scheduler state, learning rates) at that position; rows of every position so far
        self._snapshots: dict[int, tuple[dict[str, Any], list[torch.Tensor]]] = {
            0: (copy.deepcopy(scheduler.state_dict()), [t.detach().to("cpu", copy=True) for t in self.lrs])}
        self.table = torch.tensor([[float(t) for t in self._snapshots[0][1]]], dtype=torch.float64,
                                  device=device)
        self._host_steps = 0  # steps taken: an upper bound of the device position
        self.epoch = scheduler.last_epoch  # the live scheduler's position when ampkit last set it
        self.moves_other = False  # set when the schedule changes more than lr (momentum, betas)
        self.exhausted = False  # the scheduler refused to step further ahead (e.g. OneCycleLR's total_steps)
        self._extend()

    @property
    def stale(self) -> bool:
        """True when someone else moved the scheduler (loaded a state, stepped it): rebuild."""
        return self.scheduler.last_epoch != self.epoch or any(
            g["lr"] is not t for g, t in zip(self.groups, self.lrs)) or len(self.groups) != len(self.lrs)

    def after_step(self, found_inf: torch.Tensor) -> None:
        """Advance by one applied step unless ``found_inf`` (device 0.0/1.0) says it was skipped."""
        self._host_steps += 1
        while self._host_steps >= self.table.shape[0] and not self.exhausted:
            self._extend()
        self.position.add_(1).sub_(found_inf.to(torch.int64))
        index = self.position.reshape(1)
        if self.exhausted:  # past the end the last rate stays; sync() then raises the scheduler's own error
            index = index.clamp(max=self.table.shape[0] - 1)
        rows = self.table.index_select(0, index)[0]
        compat.foreach_copy_(self.lrs, list(rows.unbind()))

    def sync(self) -> None:
        """Put the scheduler object at the device's position (one host read)."""
        pos = int(self.position)
        start = max(s for s in self._snapshots if s <= pos)
        state, lrs = self._snapshots[start]
        self._simulate(state, lrs, pos - start, keep=True)
        self.epoch = self.scheduler.last_epoch

    def _extend(self) -> None:
        start = self.table.shape[0] - 1
        state, lrs = self._snapshots[start]
        rows, end = self._simulate(state, lrs, CHUNK, keep=False)
        if not rows:
            return
        if not self.exhausted:  # a scheduler that raised mid-step is in no state to snapshot
            self._snapshots[start + len(rows)] = end
        new = torch.tensor(rows, dtype=torch.float64)
        if self.device.type != "cpu":  # pinned + non_blocking: the upload does not wait for the device
            new = new.pin_memory()
        self.table = torch.cat([self.table, new.to(self.device, non_blocking=True)])

    def _simulate(self, state: dict[str, Any], lrs: list[torch.Tensor], steps: int, *, keep: bool
                  ) -> tuple[list[list[float]], tuple[dict[str, Any], list[torch.Tensor]]]:
        """Step the scheduler ``steps`` times from ``state`` on host copies of the learning rates; record
        every group's rate after each step. ``keep``: leave the scheduler there, else restore it."""
        sched = self.scheduler
        live = None if keep else copy.deepcopy(sched.state_dict())
        rows: list[list[float]] = []
        others = [_others(g) for g in self.groups]
        try:
            sched.load_state_dict(copy.deepcopy(state))
            for group, lr in zip(self.groups, lrs):
                group["lr"] = lr.clone()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()": on purpose here
                for _ in range(steps):
                    try:
                        sched.step()
                    except Exception:  # noqa: BLE001 - e.g. OneCycleLR past total_steps
                        if keep:
                            raise  # the true position is past the schedule's end: say so, as torch would
                        self.exhausted = True  # the table ends here
                        break
                    rows.append([float(g["lr"]) for g in self.groups])
            self.moves_other |= others != [_others(g) for g in self.groups]
            end = (copy.deepcopy(sched.state_dict()), [g["lr"].clone() for g in self.groups])
        finally:
            if live is not None:
                sched.load_state_dict(live)
                for group, values in zip(self.groups, others):
                    group.update(values)
            for group, lr in zip(self.groups, self.lrs):
                group["lr"] = lr
        return rows, end


class Schedules:
    """The schedulers an engine has stepped: device-driven ones keep their :class:`DeviceSchedule`."""

    def __init__(self) -> None:
        self._tables: "weakref.WeakKeyDictionary[Any, DeviceSchedule]" = weakref.WeakKeyDictionary()

    @staticmethod
    def parse(scheduler: Any) -> list[Any]:
        """``scheduler=`` as a list (None, one scheduler, or a list/tuple of them), each checked."""
        if scheduler is None:
            return []
        items = list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler]
        for item in items:
            check_scheduler(item)
        return items

    def after_step(self, schedulers: list[Any], found: torch.Tensor, host_skipped: bool | None) -> None:
        """Advance each scheduler unless the step was skipped: on the device where its optimizer is fused
        (and the schedule is only learning rates), else on the host (reading ``found`` once if the step
        did not already)."""
        for sched in schedulers:
            table = self._tables.get(sched)
            if is_fused(sched.optimizer) and (table is None or table.stale):
                table = self._tables[sched] = DeviceSchedule(sched, found.device)
            if table is not None and not table.moves_other:
                table.after_step(found)  # sync-free: the device indexes the precomputed schedule
                continue
            if host_skipped is None:
                host_skipped = bool(found)  # the one host read of this step
            if not host_skipped:
                sched.step()

    def sync(self) -> None:
        """Bring every device-driven scheduler to its true position (one host read each)."""
        for table in list(self._tables.values()):
            if not table.moves_other:
                table.sync()

    def clear(self) -> None:
        self._tables.clear()
