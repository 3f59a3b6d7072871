"""Fault injection for the distributed tests: an ``ampkit.Callback`` that the tests pass in.

In-process: ``TrainConfig(callbacks=(Faults(inf_at=3),))``. Under torchrun each rank builds it from
``--callback tests/distributed/faults.py:make``, which reads its settings from FAULTS_* variables
that the test sets (the product never reads them):

FAULTS_INF_AT=K (+ FAULTS_INF_RANK, default the last rank): that rank puts an inf into one of its
gradients before optimizer step K (after backward, after DDP's all-reduce).
FAULTS_KILL_AT=K (+ FAULTS_KILL_RANK, default 1): that rank SIGKILLs itself right after step K, once
per --out (the marker file ``.faults-killed`` remembers it).
FAULTS_DUMP=DIR: every rank writes ``DIR/rank<R>.json`` with what it ended with.
FAULTS_MARK_AT=K: rank 0 writes ``<out>/.faults-step-<K>`` after step K (a test waits for it to signal).
FAULTS_SLOW=S: every rank sleeps S seconds after each step (so that a signal lands mid-run).
FAULTS_SIGNAL_AT=K (+ FAULTS_SIGNAL_RANK, default 1, FAULTS_SIGNAL, default SIGUSR1): that rank sends
itself the signal after step K (only that rank: the others learn of it through the stop agreement).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch

import ampkit


class Faults(ampkit.Callback):
    def __init__(self, *, inf_at: int | None = None, inf_rank: int | None = None, kill_at: int | None = None,
                 kill_rank: int = 1, dump: str | None = None, mark_at: int | None = None, slow: float = 0.0,
                 signal_at: int | None = None, signal_rank: int = 1, signal_name: str = "SIGUSR1"):
        self.signal_at, self.signal_rank, self.signal = signal_at, signal_rank, signal.Signals[signal_name]
        self.inf_at, self.inf_rank = inf_at, inf_rank
        self.kill_at, self.kill_rank = kill_at, kill_rank
        self.dump, self.mark_at, self.slow = dump, mark_at, slow

    def before_step(self, state):
        inf_rank = state.world_size - 1 if self.inf_rank is None else self.inf_rank
        if self.inf_at != state.step + 1 or state.rank != inf_rank:
            return
        for p in state.model.parameters():
            g = p.grad
            local = g.to_local() if g is not None and hasattr(g, "to_local") else g
            if local is not None and local.numel():
                with torch.no_grad():
                    local.view(-1)[0] = float("inf")
                return

    def after_step(self, state):
        if self.slow:
            time.sleep(self.slow)
        if self.signal_at == state.step and state.rank == self.signal_rank:
            os.kill(os.getpid(), self.signal)
        if self.mark_at == state.step and state.rank == 0 and state.out is not None:
            (state.out / f".faults-step-{state.step}").write_text("")
        if self.kill_at == state.step and state.rank == self.kill_rank and state.out is not None:
            marker = state.out / ".faults-killed"
            if not marker.exists():
                marker.write_text(str(state.step))
                os.kill(os.getpid(), signal.SIGKILL)

    def on_end(self, state):
        if self.dump is None:
            return
        amp, opt = state.amp, state.optimizer
        stats = amp.stats() if amp.steps else {"skipped": 0, "scale": 1.0}
        local = [(p.to_local() if hasattr(p, "to_local") else p).detach().double() for p in state.model.parameters()]
        steps = sorted({float(s["step"]) for s in opt.state.values() if "step" in s})
        record = {"rank": state.rank, "skipped": stats["skipped"], "scale": stats["scale"], "optimizer_steps": steps,
                  "param_sum": float(sum(t.sum() for t in local)), "stop": state.stop,
                  "param_abs_sum": float(sum(t.abs().sum() for t in local)), "step": state.step}
        Path(self.dump).mkdir(parents=True, exist_ok=True)
        (Path(self.dump) / f"rank{state.rank}.json").write_text(json.dumps(record))


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def make() -> Faults:
    return Faults(inf_at=_int("FAULTS_INF_AT"), inf_rank=_int("FAULTS_INF_RANK"), kill_at=_int("FAULTS_KILL_AT"),
                  kill_rank=1 if _int("FAULTS_KILL_RANK") is None else _int("FAULTS_KILL_RANK"), dump=os.environ.get("FAULTS_DUMP") or None,
                  mark_at=_int("FAULTS_MARK_AT"), slow=float(os.environ.get("FAULTS_SLOW") or 0),
                  signal_at=_int("FAULTS_SIGNAL_AT"), signal_rank=1 if _int("FAULTS_SIGNAL_RANK") is None
                  else _int("FAULTS_SIGNAL_RANK"), signal_name=os.environ.get("FAULTS_SIGNAL") or "SIGUSR1")


FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults.py") + ":make"
