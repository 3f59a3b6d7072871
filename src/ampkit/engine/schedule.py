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

What is refused, because it would silently give other learning rates than the user's loop:

* A scheduler given as ``scheduler=`` and also stepped by hand (non-fused: it would advance twice per
  step; fused: the hand steps would be lost at the next table rebuild). A hand step moves ``last_epoch``
  and leaves the scheduler's ``base_lrs`` list in place; ``load_state_dict`` replaces that list, so a
  loaded state is told apart and only rebuilds the table.
* A schedule that reads state other than its step count (a ``LambdaLR`` whose function reads loop
  variables): with a fused optimizer it is evaluated ahead, so it is evaluated again at every
  :meth:`DeviceSchedule.sync` (``stats()``, ``state_dict()``) and, for ``LambdaLR`` /
  ``MultiplicativeLR`` (whose functions are the user's, also inside ``SequentialLR`` / ``ChainedScheduler``),
  at every step (the function called again on the host for the step the next rate comes from, before that
  rate is used) and each chunk when the table is extended; other learning rates now than ahead are
  refused, naming the step. Use a non-fused optimizer (its scheduler
  is stepped when it is needed) or a function of the step only.
* A scheduler passed to ``amp.step`` not from its optimizer's first step on, or not at every step (a
  per-epoch scheduler passed on an epoch's last batch, whose skip would hold the learning rate for a
  whole epoch): step per-epoch schedulers yourself after the epoch, and leave them out of ``amp.step``.
* A NaN or infinite learning rate from a scheduler, at the step that would use it.
"""

from __future__ import annotations

import copy
import math
import warnings
import weakref
from typing import Any

import torch

from ampkit import compat
from ampkit.errors import AmpkitError, UsageError
from ampkit.engine.guards import check_lrs
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


def _same_rates(now: list[float], before: list[float]) -> bool:
    """The same learning rates per group, a NaN equal to a NaN (the NaN-LR guard, not this check, names it)."""
    return len(now) == len(before) and all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(now, before))


def _marks(scheduler: Any) -> list[tuple[Any, Any]]:
    """(last_epoch, base_lrs list object) of the scheduler and of those it chains (ChainedScheduler,
    SequentialLR): a hand step changes an epoch, a loaded state the list objects."""
    items = [scheduler, *getattr(scheduler, "_schedulers", ())]
    return [(getattr(s, "last_epoch", None), getattr(s, "base_lrs", None)) for s in items]


def _loaded(now: list[tuple[Any, Any]], marks: list[tuple[Any, Any]]) -> bool:
    return len(now) != len(marks) or any(b is not b0 for (_, b), (_, b0) in zip(now, marks))


def stepped_by_hand(scheduler: Any, marks: list[tuple[Any, Any]]) -> bool:
    """True when the scheduler moved since ``marks`` without a state being loaded into it."""
    now = _marks(scheduler)
    return not _loaded(now, marks) and any(e != e0 for (e, _), (e0, _) in zip(now, marks))


def _hand_step_error(scheduler: Any) -> UsageError:
    name = type(scheduler).__name__
    return UsageError(f"{name} is given to amp.step(scheduler=...) and was also stepped by hand "
                      f"(scheduler.step()): it would advance twice per step. Do one: remove the hand "
                      f"scheduler.step(), or leave it out of amp.step")


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
        self.moves_other = False  # set when the schedule changes more than lr (momentum, betas)
        self.exhausted = False  # the scheduler refused to step further ahead (e.g. OneCycleLR's total_steps)
        self.bad_from: int | None = None  # the first position whose learning rates are not finite
        self.bad_row: list[float] = []
        self._rows: dict[int, list[list[float]]] = {}  # chunk start -> its rows, as evaluated ahead
        # a user's function (LambdaLR, MultiplicativeLR) may read loop state: its chunks are checked on extension
        user = (torch.optim.lr_scheduler.LambdaLR, torch.optim.lr_scheduler.MultiplicativeLR)
        self._users = [s for s in (scheduler, *getattr(scheduler, "_schedulers", ())) if isinstance(s, user)]
        self._user_fn = bool(self._users)
        self._probes: dict[int, list[list[tuple[int, int, list[float]]]]] = {}  # chunk start -> per step: the
        self._probe: list[list[tuple[int, int, list[float]]]] | None = None   # user functions' values ahead
        self._extend()
        self.marks = _marks(scheduler)  # the live scheduler's state when ampkit last set it

    @property
    def stale(self) -> bool:
        """True when someone else moved the scheduler (loaded a state) or the groups changed: rebuild."""
        now = _marks(self.scheduler)
        return _loaded(now, self.marks) or [e for e, _ in now] != [e for e, _ in self.marks] or any(
            g["lr"] is not t for g, t in zip(self.groups, self.lrs)) or len(self.groups) != len(self.lrs)

    def after_step(self, found_inf: torch.Tensor) -> None:
        """Advance by one applied step unless ``found_inf`` (device 0.0/1.0) says it was skipped."""
        self._host_steps += 1
        while self._host_steps >= self.table.shape[0] and not self.exhausted:
            self._extend()
        if self._user_fn:
            self._check_user_fns(self._host_steps)  # before the next rate is copied in: no stale step is taken
        if self.bad_from is not None and self._host_steps >= self.bad_from:
            self._refuse_bad(found_inf)  # a non-finite rate is within reach: one host read, then only
        self.position.add_(1).sub_(found_inf.to(torch.int64))
        index = self.position.reshape(1)
        if self.exhausted:  # past the end the last rate stays; sync() then raises the scheduler's own error
            index = index.clamp(max=self.table.shape[0] - 1)
        rows = self.table.index_select(0, index)[0]
        compat.foreach_copy_(self.lrs, list(rows.unbind()))

    def _check_user_fns(self, position: int) -> None:
        """The user's functions (LambdaLR, MultiplicativeLR) called now, at the step the next rate comes from,
        must give what they gave when evaluated ahead: one that reads loop state is refused at the step after
        the state changed, not at the next sync or table extension (a loop shorter than a chunk that never
        calls stats() would otherwise train on stale rates to its end). Host-only: calls to the user's
        functions, no device read. (Skips keep the device position behind ``position``: a function of loop
        state differs there too.)"""
        start = max((s for s in self._probes if s < position), default=None)
        if start is None or position - start > len(self._probes[start]):
            return
        for index, epoch, before in self._probes[start][position - start - 1]:
            user = self._users[index]
            now = [float(fn(epoch)) for fn in user.lr_lambdas]
            if not _same_rates(now, before):
                raise UsageError(
                    f"{type(user).__name__} gives other learning rates now (its function: {now} at step {epoch}) "
                    f"than when ampkit evaluated it ahead ({before}): with a fused optimizer the schedule is "
                    "evaluated ahead, so it must depend on the step count only (not on loop variables). Use a "
                    "function of the step, or a non-fused optimizer (fused=False)")

    def _refuse_bad(self, found_inf: torch.Tensor) -> None:
        if int(self.position) + 1 - int(found_inf) >= self.bad_from:
            row = self.bad_row
            group = next(i for i, v in enumerate(row) if not math.isfinite(v))
            raise AmpkitError(f"{type(self.scheduler).__name__} sets the learning rate of param group {group} to "
                              f"{row[group]} at its step {self.bad_from}: the next step would write "
                              f"{row[group]} weights. Check the scheduler's function and arguments")

    def sync(self) -> None:
        """Put the scheduler object at the device's position (one host read)."""
        pos = int(self.position)
        start = max(s for s in self._snapshots if s <= pos)
        state, lrs = self._snapshots[start]
        rows, _ = self._simulate(state, lrs, pos - start, keep=True)
        self.marks = _marks(self.scheduler)
        self._verify(start, rows)

    def _verify(self, start: int, rows: list[list[float]]) -> None:
        """UsageError when the schedule, evaluated again now, differs from what was evaluated ahead."""
        ahead = self._rows.get(start, [])
        for i, (now, before) in enumerate(zip(rows, ahead)):
            if not _same_rates(now, before):
                raise UsageError(
                    f"{type(self.scheduler).__name__} gives other learning rates now ({now}) than when ampkit "
                    f"evaluated it ahead ({before}) for its step {start + i + 1}: with a fused optimizer the "
                    "schedule is evaluated ahead, so it must depend on the step count only (not on loop "
                    "variables). Use a function of the step, or a non-fused optimizer (fused=False)")

    def _extend(self) -> None:
        start = self.table.shape[0] - 1
        previous = max((s for s in self._rows if s < start), default=None)
        if previous is not None and self._user_fn:  # the last chunk again: a function reading loop state shows
            self._verify(previous, self._simulate(*self._snapshots[previous], start - previous, keep=False)[0])
        state, lrs = self._snapshots[start]
        self._probe = [] if self._user_fn else None
        try:
            rows, end = self._simulate(state, lrs, CHUNK, keep=False)
        finally:
            probe, self._probe = self._probe, None
        self.marks = _marks(self.scheduler)
        if not rows:
            return
        self._rows = {k: v for k, v in self._rows.items() if k >= (previous or 0)}  # the last two chunks
        self._rows[start] = rows
        if probe is not None:
            self._probes = {k: v for k, v in self._probes.items() if k >= (previous or 0)}
            self._probes[start] = probe
        bad = next((i for i, row in enumerate(rows) if not all(map(math.isfinite, row))), None)
        if bad is not None and self.bad_from is None:
            self.bad_from, self.bad_row = start + bad + 1, rows[bad]
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
                    if self._probe is not None:  # each user function's value at its own step, as used now
                        self._probe.append([(i, u.last_epoch, [float(fn(u.last_epoch)) for fn in u.lr_lambdas])
                                            for i, u in enumerate(self._users)])
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
        self._marks: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()  # host-stepped ones
        self._passed: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # at optimizer step n

    @staticmethod
    def parse(scheduler: Any) -> list[Any]:
        """``scheduler=`` as a list (None, one scheduler, or a list/tuple of them), each checked."""
        if scheduler is None:
            return []
        items = list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler]
        for item in items:
            check_scheduler(item)
        return items

    def check(self, schedulers: list[Any], steps_of: Any) -> None:
        """Before a step: refuse schedulers stepped by hand since the engine last did, and schedulers not
        passed at every step of their optimizer (``steps_of[optimizer]``: its steps so far)."""
        for sched in schedulers:
            table = self._tables.get(sched)
            marks = table.marks if table is not None else self._marks.get(sched)
            if marks is not None and stepped_by_hand(sched, marks):
                raise _hand_step_error(sched)
            done = steps_of.get(sched.optimizer, 0)
            last = self._passed.get(sched)
            if (done if last is None else done - last - 1) > 0:
                name = type(sched).__name__
                when = (f"for the first time after {done} steps of its optimizer" if last is None else
                        f"at step {done + 1} of its optimizer and before at step {last + 1}, not in between")
                raise UsageError(
                    f"{name} is given to amp.step(scheduler=...) {when}: a scheduler given there advances on "
                    "applied steps only and must come with every step from the first (SequentialLR joins "
                    "schedules). A per-epoch scheduler: call scheduler.step() yourself after each epoch and "
                    "leave it out of amp.step (a skipped last batch would hold its rate for a whole epoch)")
            self._passed[sched] = done

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
                check_lrs([sched.optimizer], by=sched)
            self._marks[sched] = _marks(sched)
            if table is not None:
                table.marks = self._marks[sched]

    def sync(self) -> None:
        """Bring every device-driven scheduler to its true position (one host read each)."""
        for table in list(self._tables.values()):
            if not table.moves_other:
                table.sync()

    def clear(self) -> None:
        self._tables.clear()
        self._marks.clear()
        self._passed.clear()
