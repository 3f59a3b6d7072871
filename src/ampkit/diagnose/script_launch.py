"""Multi-process runs of an unmodified script for ``compare SCRIPT``: the launcher, the ranks' records, their merge.

A run of ``ampkit compare --nproc N SCRIPT`` (or ``ampkit compare -- torchrun --nproc-per-node N SCRIPT``,
``ampkit compare -- accelerate launch ... SCRIPT``) is one real launch: the launcher the user named starts
``python -m ampkit.diagnose.script_run SPEC.json`` in every rank instead of ``python SCRIPT`` (the child runs the
script under the precision switch there, so autocast and every GradScaler are switched in every rank). Each rank
writes its own record (``run-rank{R}.json``); nothing is gathered during the run. :func:`merge_ranks` then makes
one record: the loss of an optimizer step is the mean over the ranks; ranks that took different numbers of steps,
or disagree on a skipped step, end the comparison in one line, and so does a rank that died.

>>> launch, script, args = parse_launch(["torchrun", "--nproc-per-node", "2", "train.py", "--epochs", "1"])
>>> launch.nproc, script, args
(2, 'train.py', ['--epochs', '1'])
"""

from __future__ import annotations

import glob
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ampkit.errors import UsageError

__all__ = ["Launch", "parse_launch", "is_launcher", "rank_out", "launch_process", "clear_records", "rank_records",
           "merge_ranks", "launcher_tail"]



@dataclass(frozen=True, kw_only=True)
class Launch:
    """How every run is launched: ``kind`` ``"torchrun"`` or ``"accelerate"``, the launcher's own ``options``
    (as the user gave them, before the script) and the processes it starts (``nproc``, None when the launcher's
    configuration decides)."""

    kind: str
    options: tuple[str, ...]
    nproc: int | None

    @classmethod
    def torchrun(cls, nproc: int) -> "Launch":
        """``--nproc N``: torchrun on this node, ``--standalone`` (a free port of its own)."""
        if nproc < 1:
            raise UsageError(f"--nproc must be >= 1, got {nproc}")
        return cls(kind="torchrun", options=("--standalone", "--nproc-per-node", str(nproc)), nproc=nproc)

    def argv(self, entry: str, spec: str) -> list[str]:
        """The command of one run: the launcher, its options, and ampkit's child module in place of the script."""
        head = ([sys.executable, "-m", "torch.distributed.run"] if self.kind == "torchrun"
                else [sys.executable, "-m", "accelerate.commands.launch"])
        return [*head, *self.options, "-m", entry, spec]

    def describe(self) -> str:
        """The launch as the user would type it, without the script (for the report)."""
        name = "torchrun" if self.kind == "torchrun" else "accelerate launch"
        return " ".join([name, *self.options])


def is_launcher(word: str, rest: Sequence[str] = ()) -> bool:
    """Whether the command line ``word rest...`` starts with a launcher (torchrun, accelerate launch,
    python -m torch.distributed.run) rather than a script."""
    if word.endswith(".py") or os.path.isfile(word):
        return False
    base = os.path.basename(word)
    if base == "torchrun" or (base == "accelerate" and list(rest[:1]) == ["launch"]):
        return True
    return base.startswith("python") and list(rest[:2]) == ["-m", "torch.distributed.run"]


def parse_launch(words: Sequence[str]) -> tuple[Launch, str, list[str]]:
    """``torchrun OPTS SCRIPT ARGS`` / ``python -m torch.distributed.run OPTS SCRIPT ARGS`` /
    ``accelerate launch OPTS SCRIPT ARGS`` -> (the launch, SCRIPT, ARGS). A one-line UsageError for what compare
    cannot launch (several nodes, ``--no-python``, ``-m module``, no script)."""
    words = list(words)
    base = os.path.basename(words[0])
    if base == "accelerate":
        kind, rest = "accelerate", words[2:]
    elif base == "torchrun":
        kind, rest = "torchrun", words[1:]
    else:
        kind, rest = "torchrun", words[3:]
    flags = _flags(kind)
    options: list[str] = []
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        word = rest[i]
        name = word.split("=", 1)[0]
        if name in ("-m", "--module", "--no-python", "--no_python"):
            raise UsageError(f"{kind} {name}: compare runs a SCRIPT file under the launcher; give the script's path")
        options.append(word)
        takes_value = "=" not in word and name not in flags
        if takes_value and i + 1 < len(rest):
            options.append(rest[i + 1])
            i += 1
        i += 1
    if i >= len(rest):
        raise UsageError(f"no script after `{' '.join(words[:1 if kind == 'torchrun' else 2])}` and its options: "
                         f"ampkit compare -- {kind if kind == 'torchrun' else 'accelerate launch'} OPTIONS SCRIPT ARGS")
    nodes = _option(options, ("--nnodes", "--num_machines", "--num-machines"))
    if nodes not in (None, "1", "1:1"):
        raise UsageError(f"compare launches on this machine only, not on {nodes} nodes: run it with one node "
                         f"(--nnodes 1) and the number of processes of one node")
    nproc = _option(options, ("--nproc-per-node", "--nproc_per_node", "--num_processes", "--num-processes"))
    if kind == "torchrun" and not any(o.split("=", 1)[0] in ("--standalone", "--rdzv-endpoint", "--rdzv_endpoint",
                                                              "--master-port", "--master_port") for o in options):
        options.insert(0, "--standalone")  # a free port per run: runs (and other jobs) never collide on 29500
    return Launch(kind=kind, options=tuple(options), nproc=int(nproc) if nproc and nproc.isdigit() else None), \
        rest[i], rest[i + 1:]


def _flags(kind: str) -> set[str]:
    """The launcher's options that take no value, read from its own argument parser (they change between
    versions: Accelerate adds flags often)."""
    if kind == "torchrun":
        from torch.distributed.run import get_args_parser as make
    else:
        try:
            from accelerate.commands.launch import launch_command_parser as make
        except ImportError:
            raise UsageError("accelerate launch: Accelerate is not installed here (pip install accelerate)") from None
    return {s for action in make()._actions if action.nargs == 0 for s in action.option_strings}


def _option(options: list[str], names: tuple[str, ...]) -> str | None:
    for j, word in enumerate(options):
        name, _, value = word.partition("=")
        if name in names:
            return value if value else (options[j + 1] if j + 1 < len(options) else None)
    return None


# ---------------------------------------------------------------------------------------- a rank's side
def rank_out(out: str) -> tuple[str, int, int]:
    """Where this process writes its record, its rank and the world size: ``run.json`` alone, or
    ``run-rank{R}.json`` in a launched run (``RANK`` / ``WORLD_SIZE`` from the launcher)."""
    rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    return str(Path(out).with_name(f"run-rank{rank}.json")), rank, world


# ---------------------------------------------------------------------------------------- the parent's side
def launch_process(argv: list[str], *, env: dict[str, str], stdout: Any, stderr: Any,
                   timeout_s: float | None) -> int:
    """Run the launcher tied to ampkit (:func:`ampkit.children.run_tied`: its own process group, stopped as a
    whole, launcher and ranks, on a timeout, a stop signal or any error here, and killed if ampkit dies). Returns the
    exit code; raises ``subprocess.TimeoutExpired`` after stopping the group."""
    from ampkit.children import run_tied

    return run_tied(argv, stdout=stdout, stderr=stderr, env=env, timeout_s=timeout_s).returncode


def clear_records(out: str | Path) -> None:
    """Remove the rank records an earlier comparison left in the run's folder (they must not pass for this run's)."""
    for old in glob.glob(str(Path(out).with_name("run-rank*.json"))):
        os.unlink(old)


def rank_records(out: str | Path) -> list[dict[str, Any]]:
    """The records the ranks of a launched run wrote, by rank."""
    import json

    files = glob.glob(str(Path(out).with_name("run-rank*.json")))
    recs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in files]
    return sorted(recs, key=lambda r: r.get("rank", 0))


def merge_ranks(recs: list[dict[str, Any]], *, what: str, code: int | None = None, tail: str = "") -> dict[str, Any]:
    """One record from the ranks' records: per optimizer step the mean loss over the ranks, the skip and scale of
    rank 0 (every rank must agree on a skip), the union of autocasts and switches. ``what`` names the run in
    messages ("the FP32 run of seed 0 of train.py"). Raises a one-line UsageError when a rank left no record
    (``code``: the launcher's exit code; ``tail``: the last line of its error output), or when ranks disagree."""
    if not recs:
        raise UsageError(f"{what} ended without a record from any rank (exit {code})" + (f": {tail}" if tail else ""))
    world = max(r.get("world", 1) for r in recs)
    have = {r.get("rank", 0) for r in recs}
    missing = sorted(set(range(world)) - have)
    refused = next((r for r in recs if r.get("refusal")), None)
    if refused is not None:  # the script's own refusal (every rank would say it)
        return refused
    failed = next((r for r in recs if r.get("error")), None)
    if missing:  # a rank that died first: the others' errors (a closed connection) follow from it
        then = f"; then rank {failed.get('rank', 0)}: {failed['error']}" if failed else ""
        raise UsageError(f"{what}: rank {missing[0]} of {world} died without a record (launcher exit {code}"
                         + (f"; {tail}" if tail else "") + f"){then}; no verdict")
    if failed is not None:
        return dict(failed, error=f"rank {failed.get('rank', 0)}: {failed['error']}")
    steps = {r["rank"]: r["steps"] for r in recs}
    if len(set(steps.values())) > 1:
        pairs = ", ".join(f"rank {k} took {v}" for k, v in sorted(steps.items()))
        raise UsageError(f"{what}: the ranks disagree on the optimizer steps ({pairs}); no verdict")
    n = recs[0]["steps"]
    skips = [[r["skipped"][i] for r in recs] for i in range(n)]
    split = next((i for i, s in enumerate(skips) if len({bool(v) for v in s}) > 1), None)
    if split is not None:
        said = ", ".join(f"rank {r['rank']} {'skipped' if r['skipped'][split] else 'stepped'}" for r in recs)
        raise UsageError(f"{what}: the ranks disagree on skipping optimizer step {split + 1} ({said}); no verdict")
    merged = dict(recs[0])
    merged["losses"] = [_mean([r["losses"][i] for r in recs]) for i in range(n)]
    merged["autocast"] = sorted({a for r in recs for a in r["autocast"]})
    merged["scaler_enabled"] = any(r["scaler_enabled"] for r in recs)
    merged["cpu_s"] = sum(r["cpu_s"] for r in recs)
    merged["low_weights"] = sorted({a for r in recs for a in r.get("low_weights", [])})
    merged["ranks"] = world
    return merged


def launcher_tail(stderr: str) -> str:
    """What the launcher's error output says of the failure: torchrun's root cause ("rank 1 exit code 3"), else
    its last line."""
    import re

    found = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", stderr, re.DOTALL)
    if found:
        return f"root cause: rank {found.group(1)} exit code {found.group(2)}"
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _mean(values: list[float | None]) -> float | None:
    if any(v is None for v in values):
        return None
    return math.fsum(values) / len(values)
