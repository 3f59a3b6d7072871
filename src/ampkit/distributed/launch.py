"""``ampkit train --nproc N``: torchrun on this node, run in this process so that a stop signal gives
the job's exit code (128 + signal number) instead of torchrun's traceback."""

from __future__ import annotations

import sys

from ampkit.errors import AmpkitError, UsageError, in_chain

__all__ = ["torchrun_argv", "run_torchrun", "TORCHRUN_SIGNALS"]

# The signals torchrun forwards to its workers by default (then it waits for them to exit).
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def torchrun_args(nproc: int, train_args: list[str], *, max_restarts: int = 0,
                  stop_signal: str | None = None) -> list[str]:
    """torchrun's own arguments for one node of ``nproc`` processes running ``ampkit train train_args``.

    ``stop_signal`` (e.g. ``"SIGUSR1"``) is added to the signals torchrun catches and forwards to the
    workers (without it torchrun would die of it and leave them running).
    """
    if nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    args = ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)]
    if stop_signal is not None and stop_signal not in TORCHRUN_SIGNALS:
        args += ["--signals-to-handle", ",".join((*TORCHRUN_SIGNALS, stop_signal))]
    return [*args, "-m", "ampkit", "train", *train_args]


def torchrun_argv(nproc: int, train_args: list[str], *, max_restarts: int = 0,
                  stop_signal: str | None = None) -> list[str]:
    """The same as a command line: ``python -m torch.distributed.run ...`` (to show it, or to run it elsewhere)."""
    return [sys.executable, "-m", "torch.distributed.run",
            *torchrun_args(nproc, train_args, max_restarts=max_restarts, stop_signal=stop_signal)]


def run_torchrun(args: list[str]) -> int:
    """Run torchrun with ``args`` (:func:`torchrun_args`) in this process; returns the job's exit code.

    0 when every rank finished; 128 + N when the job was stopped by signal N (torchrun forwards it
    to the ranks, which agree on a step, save one checkpoint and exit 128 + N themselves). A rank
    that failed otherwise raises :class:`AmpkitError` naming it (its own error is above in the output).
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(args))
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode
        if code > 128:
            # The ranks agreed on a stop signal that torchrun did not see (sent to the workers only) and
            # saved their checkpoint; the first to exit made torchrun end the others.
            return code
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise AmpkitError(f"rank {rank} {how} (its error is in the output above); the job stopped") from exc
    except Exception as exc:
        # torch's elastic agent can turn the signal into another error: its metrics wrapper fails with an
        # UnboundLocalError when the SignalException lands before it started timing (seen on torch 2.13).
        signalled = in_chain(exc, SignalException)
        if signalled is None:
            raise
        return 128 + int(signalled.sigval)
    return 0

