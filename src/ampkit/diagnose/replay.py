"""``ampkit diagnose --replay RUN_DIR[:STEP]``: find the op behind a halted run of ``ampkit train``.

1. The run is rebuilt from its record (``RUN_DIR/run.json``: task spec and options, precision, FP32 regions,
   seed, engine settings) on one process, with nothing written to ``RUN_DIR``.
2. The last good checkpoint (:mod:`ampkit.checkpoint.rotation`) is loaded: weights, optimizer, scheduler,
   engine (loss scale, counters) and RNG, so the steps after it are the run's own steps again.
3. The same training loop (:func:`ampkit.training.loop.train_loop`) replays the task's deterministic batches
   up to the first bad step: the halt's record names it (the first skipped step of the streak); without one,
   or with ``:STEP``, the step is the first skipped one after the checkpoint, or ``STEP``.
4. That step runs under the non-finite locator (:class:`~ampkit.diagnose.nonfinite.NonFiniteLocator`): the
   finding's code, module path, file:line, forward or backward. A forward finding's op is then found with
   :func:`~ampkit.diagnose.nonfinite.first_nonfinite_op` on a copy of the model, with the innermost line of the
   task's code that ran it.
5. The same step, from the same state (a copy of the model taken before it, and the same RNG), runs in FP32:
   finite means the precision is the cause (the fix keeps the module in FP32, or uses BF16); not finite
   means the model or the data (no precision change will help).
6. ``fix_check``: the run is rebuilt once more with the module added to ``fp32_modules``, loaded from the
   same checkpoint, and trained ``fix_steps`` steps past the bad step; the fix holds when none is skipped.

A DDP run replays on one process with the whole global batch per step (what the ranks' shares average to);
an FSDP2 run's sharded (DCP) checkpoint loads without a process group, unsharded, where torch's
``torch.distributed.checkpoint`` can read it so (a one-line error says when it cannot).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ampkit.checkpoint import rng_state, set_rng_state
from ampkit.checkpoint.dcp import RunCheckpoints
from ampkit.device import detect_device
from ampkit.diagnose.findings import Finding
from ampkit.diagnose.nonfinite import NonFiniteLocator, first_nonfinite_op
from ampkit.diagnose.replay_range import check_replay_step
from ampkit.diagnose.tracking import ModuleTracker, UserCode, short_path
from ampkit.errors import CheckpointError, UsageError
from ampkit.tasks import Task
from ampkit.training.callbacks import Callback, TrainState
from ampkit.training.config import TrainConfig
from ampkit.training.loop import batch_to, train_loop
from ampkit.training.metrics import MetricsSink
from ampkit.training.record import config_fields, read_record
from ampkit.training.setup import Run, build_run
from ampkit.training.stop import StopRequest

__all__ = ["ReplayResult", "replay_run", "parse_target", "FIX_STEPS"]

FIX_STEPS = 5  # --fix-check trains this many steps past the bad step


@dataclass
class ReplayResult:
    """What a replay found. ``cause``: ``"precision"`` (FP32 stays finite), ``"model-or-data"`` (it does
    not), or ``"not-reproduced"`` (the replayed step was finite)."""

    run_dir: str
    checkpoint: str | None  # None: the run's start, rebuilt from its seed
    checkpoint_step: int
    step: int | None  # the first bad step (1-based optimizer step), None when none was found
    precision: str
    cause: str
    finding: Finding | None = None
    module: str | None = None  # the module's name inside the model (what --fp32-modules takes)
    phase: str | None = None  # "forward" | "backward"
    op: str | None = None
    op_where: str | None = None  # file:line of the task's code that ran the op (forward)
    fp32_finite: bool | None = None
    suggestion: str | None = None
    fix_check: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["finding"] = self.finding.to_dict() if self.finding is not None else None
        return out


def parse_target(text: str) -> tuple[Path, int | None]:
    """``runs/x`` -> (runs/x, None); ``runs/x:120`` -> (runs/x, 120)."""
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit() and head:
        step = int(tail)
        if step < 1:
            raise UsageError(f"--replay {text}: STEP is an optimizer step, 1 or more")
        return Path(head), step
    return Path(text), None


# ---------------------------------------------------------------------------- rebuilding the run
def _rebuild(record: dict[str, Any], device: str | None, *, extra_fp32: str | None = None) -> Run:
    fields = config_fields(record)
    if extra_fp32 is not None:
        fields["fp32_modules"] = tuple(fields["fp32_modules"] or ()) + (extra_fp32,)
    # No skip limit (the replay goes into the streak on purpose), eager steps (hooks see every module), no --out.
    fields["max_consecutive_skips"] = None
    cfg = TrainConfig(**fields, device=device, graph=False, evaluate=False)
    cfg.validate()
    return build_run(cfg, None, detect_device(device), task=None, precision=None)


def _choose_checkpoint(ckpts: RunCheckpoints, record: dict[str, Any],
                       step: int | None) -> tuple[int, Path | None, int | None]:
    """``(checkpoint step, path, target step or None)``: the last good checkpoint and the halt's first bad
    step; with ``step`` given, the newest checkpoint from before it. Without such a checkpoint, a run that
    started at step 0 replays from its start (``path`` None): its seed rebuilds the initial state exactly."""
    from_start = int(record.get("start_step") or 0) == 0
    if step is not None:
        before = [sp for sp in sorted(ckpts.candidates()) if sp[0] < step]
        if before:
            return before[-1][0], before[-1][1], step
        if from_start:
            return 0, None, step
        raise UsageError(f"no checkpoint in {ckpts.folder} is from before step {step}, and the run resumed at step "
                         f"{record.get('start_step')}: give a later STEP")
    target = (record.get("halt") or {}).get("first_bad_step")
    good = ckpts.last_good()
    if good is None:
        if not from_start:
            raise UsageError(f"{ckpts.folder} names no good checkpoint (last-good.json) and the run resumed at step "
                             f"{record.get('start_step')}: give the step to replay, --replay RUN_DIR:STEP")
        good = (0, None)
    if target is not None and target <= good[0]:
        target = None
    return good[0], good[1], target


def _load(run: Run, folder: Path, path: Path | None, sharded: bool) -> list[str]:
    if path is None:
        return ["no checkpoint from before the bad step: replayed from step 0, rebuilt from the run's seed"]
    ckpts = RunCheckpoints(folder, keep=10**9, sharded=sharded)
    try:
        _, notes = ckpts.restore(path, model=run.model, optimizer=run.optimizer, amp=run.amp, device=run.device,
                                 scheduler=run.scheduler)
    except CheckpointError as exc:
        kind = "sharded (DCP) " if path.suffix == ".dcp" else ""
        raise CheckpointError(f"the {kind}checkpoint {path} cannot be replayed on one process: {exc}") from exc
    return notes


# ---------------------------------------------------------------------------- the step under the locator
class _TaskCode(UserCode):
    """The task's own files are the user's code here, also for a built-in task (which lives in ampkit)."""

    def __init__(self, folders: list[str]) -> None:
        super().__init__(folders[0])
        self.folders = [os.path.abspath(f) + os.sep for f in folders]

    def is_user_file(self, filename: str) -> bool:
        path = os.path.abspath(filename)
        return any(path.startswith(f) for f in self.folders) and "site-packages" not in path


def _task_folders(task: Task) -> list[str]:
    folders = []
    for obj in (type(task.model), task.loss, task.batch):
        with contextlib.suppress(TypeError, OSError):
            src = inspect.getsourcefile(obj)
            if src and os.path.dirname(src) not in folders:
                folders.append(os.path.dirname(src))
    return folders or [os.getcwd()]


class _Hooks:
    """Global module hooks that feed the locator, on while one step replays."""

    def __init__(self, locator: NonFiniteLocator, tracker: ModuleTracker, user: UserCode) -> None:
        self.locator, self.tracker, self.user = locator, tracker, user
        self.off = 0
        self.step = 0
        self.handles: list[Any] = []

    @contextlib.contextmanager
    def paused(self):
        self.off += 1
        try:
            yield
        finally:
            self.off -= 1

    def install(self) -> None:
        mm = torch.nn.modules.module
        self.handles = [mm.register_module_forward_pre_hook(self._pre),
                        mm.register_module_forward_hook(self._post, with_kwargs=True, always_call=True)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _pre(self, module, args):
        if not self.off:
            self.tracker.enter(module)

    def _post(self, module, args, *rest):
        if self.off:
            return None
        self.tracker.leave()
        if len(rest) == 2:  # (kwargs, output); forward raised otherwise
            with self.paused():
                self.locator.record(module, args, rest[0], rest[1], self.user.where(), self.step)
        return None


class _Replayer(Callback):
    """Watches the replayed loop: finds the first skipped step when it is not known, and runs the target
    step under the locator, with its FP32 twin from the same state."""

    def __init__(self, run: Run, start: int, target: int | None) -> None:
        self.run, self.start, self.target = run, start, target
        user = _TaskCode(_task_folders(run.task))
        self.tracker = ModuleTracker(user)
        self.tracker.add_root(run.raw_model, "model")
        self.hooks = _Hooks(NonFiniteLocator(self.tracker, lambda: self.hooks.paused()), self.tracker, user)
        self.findings: list[Finding] = []
        self.first_skip: int | None = None
        self.located = False
        self.before: tuple[torch.nn.Module, dict[str, Any]] | None = None  # model copy and RNG before the step

    def on_start(self, state: TrainState) -> None:
        self._arm(state.step)

    def after_step(self, state: TrainState) -> None:
        if self.hooks.handles:
            self.hooks.remove()
        if self.target is None and bool(self.run.amp.last_skipped):  # one host read per step: a diagnosis
            self.first_skip = state.step
            raise _Found()
        self._arm(state.step)

    def _arm(self, done: int) -> None:
        if done + 1 == self.target:
            self.before = (copy.deepcopy(self.run.raw_model), rng_state(self.run.device))
            self.hooks.step = done
            self.hooks.install()

    def before_step(self, state: TrainState) -> None:
        if self.hooks.handles and state.step + 1 == self.target:
            with self.hooks.paused():
                self.findings = self.hooks.locator.flush(report_backward=True)
            self.located = True


class _Found(Exception):
    """The scan found the first skipped step: the loop ends there."""


def _run_until(run: Run, start: int, total: int, callback: Callback) -> None:
    """The training loop itself, from ``start`` to step ``total``, with ``callback`` watching."""
    run.total = total
    run.callbacks = [*run.callbacks, callback]
    sink = MetricsSink(None, write=False, resumed_at=start, tensorboard=False, monitor=None, progress=None)
    stop = StopRequest((), check_every=1)
    try:
        train_loop(run, start, sink, stop)
    except _Found:
        pass
    finally:
        sink.close()
        if isinstance(callback, _Replayer):
            callback.hooks.remove()


def _batches(run: Run, step: int) -> list[Any]:
    acc = run.config.accumulation_steps
    return [batch_to(run.batch((step - 1) * acc + micro), run.device) for micro in range(acc)]


def _fp32_finite(run: Run, model: torch.nn.Module, rng: dict[str, Any], step: int) -> bool:
    """Forward and backward of ``step``'s batches in FP32 (autocast off) on a copy of the model."""
    model = copy.deepcopy(model).float()
    for p in model.parameters():
        p.grad = None
    with _rng(run, rng), torch.autocast(run.device.type, enabled=False):
        for batch in _batches(run, step):
            loss = run.task.loss(model, batch)
            if not bool(torch.isfinite(loss.detach()).all()):
                return False
            loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return all(bool(torch.isfinite(g).all()) for g in grads)


@contextlib.contextmanager
def _rng(run: Run, state: dict[str, Any]):
    devices = [run.device.torch_device.index or 0] if run.device.is_accelerator else []
    with torch.random.fork_rng(devices=devices, device_type=run.device.torch_device.type if devices else "cuda"):
        set_rng_state(state, run.device)
        yield


def _op_where(run: Run, model: torch.nn.Module, rng: dict[str, Any], step: int,
              user: UserCode) -> tuple[str | None, str | None]:
    """The first op of ``step``'s forward (in the run's precision) that turns finite inputs into inf/NaN, and
    the innermost line of the task's code that ran it."""
    model = copy.deepcopy(model)
    where: list[str] = []

    def forward() -> None:
        for batch in _batches(run, step):
            run.task.loss(model, batch)

    class _Line(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not where:
                outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(t, torch.Tensor) and t.is_floating_point()]
                if outs and not all(bool(torch.isfinite(t).all()) for t in outs):
                    frame = user.frame(1)
                    if frame is not None:
                        where.append(f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}")
            return out

    with _rng(run, rng), torch.no_grad(), run.amp.autocast():
        hit = first_nonfinite_op(forward)
    with _rng(run, rng), torch.no_grad(), run.amp.autocast(), _Line():
        forward()
    return (hit.op if hit is not None else None), (where[0] if where else None)


# ---------------------------------------------------------------------------- the replay
def replay_run(run_dir: str | os.PathLike, *, step: int | None = None, fix_check: bool = False,
               device: str | None = None, fix_steps: int = FIX_STEPS) -> ReplayResult:
    """Replay the first bad step of the run in ``run_dir`` (see the module's docstring)."""
    out = Path(run_dir)
    record = read_record(out)
    if not record.get("replayable", True):
        raise UsageError(f"{out} cannot be replayed: {record.get('replay_blocker')}")
    sharded = record.get("strategy") == "fsdp"
    ckpts = RunCheckpoints(out / "checkpoints", keep=10**9, sharded=sharded)
    check_replay_step(out, record, [sp[0] for sp in ckpts.candidates()], step)  # before minutes of replay
    ck_step, ck_path, target = _choose_checkpoint(ckpts, record, step)
    run = _rebuild(record, device)
    try:
        notes = _load(run, ckpts.folder, ck_path, sharded)
        if record.get("world_size", 1) > 1:
            notes.append(f"a {record['world_size']}-process {record.get('strategy') or 'ddp'} run replayed on one "
                         "process with each step's whole global batch")
        result = ReplayResult(run_dir=str(out), checkpoint=str(ck_path) if ck_path else None,
                              checkpoint_step=ck_step, step=None,
                              precision=run.precision.name, cause="not-reproduced", notes=notes)
        if target is None:  # find the first skipped step, then replay it from the checkpoint again
            scan = _Replayer(run, ck_step, None)
            _run_until(run, ck_step, int(record.get("steps") or run.total), scan)
            if scan.first_skip is None:
                result.notes.append(f"no step from {ck_step + 1} to {run.total} was skipped in the replay")
                return result
            target = scan.first_skip
            _close(run)
            run = _rebuild(record, device)
            _load(run, ckpts.folder, ck_path, sharded)
        _locate(run, ck_step, target, result)
    finally:
        _close(run)
    if fix_check and result.cause == "precision" and result.module:
        result.fix_check = _fix_check(record, device, ckpts.folder, ck_path, sharded, ck_step, target,
                                      result.module, fix_steps)
    return result


def _locate(run: Run, start: int, target: int, result: ReplayResult) -> None:
    rep = _Replayer(run, start, target)
    _run_until(run, start, target, rep)
    result.step = target
    finding = next(iter(rep.findings), None)
    model, rng = rep.before
    result.fp32_finite = _fp32_finite(run, model, rng, target)
    if run.precision.name == "fp8":
        result.notes.append("an FP8 run: its FP32 replay still runs torchao's Float8Linear layers (autocast off "
                            "only), so FP32 finite/not finite covers the rest of the model")
    if finding is None:
        skipped = bool(run.amp.last_skipped)
        result.notes.append(f"step {target} was {'skipped' if skipped else 'finite'} in the replay and the locator "
                            "found no module whose output or gradient turned non-finite")
        result.cause = "not-reproduced" if not skipped else ("precision" if result.fp32_finite else "model-or-data")
        return
    result.finding = finding
    result.phase = "forward" if finding.code == "nonfinite-forward" else "backward"
    full = finding.where.split(" · ", 1)[0]
    result.module = rep.tracker.relative(full)
    inputs_bad = "already inf/NaN" in finding.message
    if result.phase == "forward" and not inputs_bad:
        result.op, result.op_where = _op_where(run, model, rng, target, rep.hooks.user)
    if result.fp32_finite:
        result.cause = "precision"
        result.suggestion = (f"keep `{result.module}` in FP32: `ampkit train --fp32-modules {result.module}` "
                             "(or --precision bf16 where the card has it)")
    else:
        result.cause = "model-or-data"
        result.suggestion = (f"step {target} is not finite in FP32 either: the model or the data (e.g. the batch "
                             "of that step, the learning rate) is the cause, and no precision change will help")


def _fix_check(record: dict[str, Any], device: str | None, folder: Path, path: Path | None, sharded: bool, start: int,
               target: int, module: str, steps: int) -> dict[str, Any]:
    run = _rebuild(record, device, extra_fp32=module)
    skipped: list[int] = []

    class _Watch(Callback):
        def after_step(self, state: TrainState) -> None:
            if state.step >= target and bool(run.amp.last_skipped):
                skipped.append(state.step)

    try:
        _load(run, folder, path, sharded)
        _run_until(run, start, target + steps - 1, _Watch())
    finally:
        _close(run)
    return {"fp32_modules": module, "from_step": target, "to_step": target + steps - 1, "skipped_steps": skipped,
            "holds": not skipped}


def _close(run: Run) -> None:
    if run.regions is not None:
        run.regions.remove()
    run.amp.close()

