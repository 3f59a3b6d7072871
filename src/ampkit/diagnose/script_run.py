"""One run of an unmodified script in a fresh process, FP32 or AMP, seed k: ``compare SCRIPT`` and ``audit SCRIPT``.

:func:`run_script` (the parent side) starts ``python -m ampkit.diagnose.script_run SPEC.json`` with the
script's arguments, its output going to ``stdout.txt`` / ``stderr.txt`` in the run's folder; the child
(:func:`main`) runs the script as ``python SCRIPT ARGS`` would (``runpy``, ``__main__``, ``sys.argv``,
``sys.path[0]``), under :class:`~ampkit.diagnose.switch.Switch`, and writes what it recorded to
``run.json``. One process per run: nothing a run imports, seeds, caches or leaves on a device can leak
into the next one. Nothing here judges or prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampkit.children import run_tied
from ampkit.errors import UsageError

__all__ = ["ScriptRun", "run_script", "check_script", "main", "STOPPED_BY"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: How a run's ``stopped`` begins when a signal stopped it ("stopped by SIGINT"): the caller judges no such run.
STOPPED_BY = "stopped by SIG"


@dataclass(frozen=True, kw_only=True)
class ScriptRun:
    """What one run of the script recorded: per optimizer step its loss, skip flag (0/1) and loss scale
    (None where there is none), why it stopped, its output, and its wall and CPU time."""

    mode: str
    seed: int
    steps: int
    losses: list[float | None]
    skipped: list[float | None]
    scales: list[float | None]
    stopped: str
    autocast: list[str]
    scalers: int
    scaler_enabled: bool
    stdout: str
    folder: str
    wall_s: float
    cpu_s: float
    audit: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)  # each interval between two optimizer steps (StepTimer)
    peak_bytes: int | None = None  # peak device memory of the run's process (None on the CPU)
    switched: dict[str, int] = field(default_factory=dict)  # low-precision conversions made no-ops (FP32 runs)
    low_weights: list[str] = field(default_factory=list)  # "device:dtype" the script converted its model to (AMP)
    ranks: int = 1


def check_script(path: str, what: str = "compare") -> str:
    """The script's absolute path, or the one-line UsageError of a missing script or a multi-process launch."""
    if not path:
        raise UsageError(f"no script given: ampkit {what} [OPTIONS] SCRIPT [ARGS...]")
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"script not found: {path}")
    launched = [f"{v}={os.environ[v]}" for v in ("WORLD_SIZE", "LOCAL_WORLD_SIZE") if os.environ.get(v, "1") not in ("", "0", "1")]
    launched += [f"{v}={os.environ[v]}" for v in ("TORCHELASTIC_RUN_ID",) if os.environ.get(v)]
    if launched:
        raise UsageError(f"ampkit {what} SCRIPT runs one process, but this one was launched for several ({launched[0]}, "
                         f"torchrun?): run `ampkit {what}` itself as one process; for a multi-process script give "
                         f"it the launch: `ampkit compare --nproc N SCRIPT` or `ampkit compare -- torchrun ... SCRIPT`")
    return full


def run_script(script: str, args: list[str] | tuple[str, ...], *, mode: str, seed: int, folder: str | Path,
               precision: str | None = None, steps: int | None = None, audit: bool = False,
               timeout_s: float | None = None, entry: str = "ampkit.diagnose.script_run",
               launch: Any = None) -> ScriptRun:
    """Run ``python script *args`` once in a fresh process in ``mode`` (``"fp32"``/``"amp"``) with seed ``seed``.

    ``precision`` (``"bf16"``/``"fp16"``) forces the AMP runs' autocast dtype; ``steps`` stops the script after
    that many optimizer steps; ``launch`` (a :class:`~ampkit.diagnose.script_launch.Launch`) runs every rank
    under torchrun / accelerate launch and merges the ranks' records; ``audit`` lets the recorder stop the run (after
    the step it audits) and keeps its result (``entry``: the child's module, ``python -m ENTRY SPEC.json``;
    ``ampkit.verify.script_audit`` records the step's ops).
    Raises :class:`~ampkit.errors.UsageError` with one line when the script cannot be compared: it crashed
    (its own error line), it never took an optimizer step, or it does something switching cannot undo."""
    full = check_script(script)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"script": full, "args": list(args), "mode": mode, "seed": seed, "steps": None if audit else steps,
            "dtype": _DTYPES.get(precision or ""), "audit": audit, "out": str(folder / "run.json"),
            "launched": launch is not None}
    (folder / "spec.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    result_file = Path(spec["out"])
    if result_file.exists():
        result_file.unlink()  # a stale record of an earlier comparison must not pass for this run's
    if launch is not None:
        from ampkit.diagnose import script_launch

        script_launch.clear_records(result_file)
    env = dict(os.environ, PYTHONHASHSEED="0")
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        try:
            # Its own process group, stopped as a whole if this wait ends early (a stop signal, a timeout),
            # and killed by the kernel if ampkit dies: no run trains on after ampkit is gone. A launcher (torchrun,
            # accelerate launch) leads the group of its ranks.
            argv = [sys.executable, "-m", entry, str(folder / "spec.json")] if launch is None else \
                launch.argv(entry, str(folder / "spec.json"))
            code = run_tied(argv, stdout=out, stderr=err, env=env, timeout_s=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise UsageError(f"{_label(mode, seed)} of {script} did not finish in {timeout_s:.0f} s: pass --steps N "
                             f"to stop each run after N optimizer steps") from None
    wall = time.perf_counter() - t0
    stdout = (folder / "stdout.txt").read_text(encoding="utf-8", errors="replace")
    if launch is not None:
        tail = script_launch.launcher_tail((folder / "stderr.txt").read_text(encoding="utf-8", errors="replace"))
        rec = script_launch.merge_ranks(script_launch.rank_records(result_file), code=code, tail=tail,
                                        what=f"the {_label(mode, seed)} of {script} ({launch.describe()})")
    elif not result_file.exists():
        tail = _last_line((folder / "stderr.txt").read_text(encoding="utf-8", errors="replace"))
        raise UsageError(f"the {_label(mode, seed)} of {script} ended without a record (exit {code})"
                         + (f": {tail}" if tail else "") + f"; its output is in {folder}")
    else:
        rec = json.loads(result_file.read_text(encoding="utf-8"))
    _refuse(rec, script, mode, seed, folder)
    return ScriptRun(mode=mode, seed=seed, steps=rec["steps"], losses=rec["losses"], skipped=rec["skipped"],
                     scales=rec["scales"], stopped=rec["stopped"], autocast=rec["autocast"], scalers=rec["scalers"],
                     scaler_enabled=rec["scaler_enabled"], stdout=stdout, folder=str(folder), wall_s=wall,
                     cpu_s=rec["cpu_s"], audit=rec.get("audit"), step_ms=rec.get("step_ms") or [],
                     peak_bytes=rec.get("peak_bytes"), switched=rec.get("switched", {}),
                     low_weights=rec.get("low_weights", []), ranks=rec.get("ranks", 1))


def _label(mode: str, seed: int) -> str:
    return f"{'FP32' if mode == 'fp32' else 'AMP'} run of seed {seed}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _refuse(rec: dict[str, Any], script: str, mode: str, seed: int, folder: Path) -> None:
    if rec.get("refusal"):
        raise UsageError(f"cannot compare {script}: {rec['refusal']}")
    if rec.get("error"):
        where = f" at {rec['where']}" if rec.get("where") else ""
        raise UsageError(f"{script} failed in the {_label(mode, seed)}{where}: {rec['error']} (the script's own "
                         f"error; its output and traceback: {folder}/stderr.txt)")
    if rec["steps"] == 0 and not rec["stopped"].startswith(STOPPED_BY):
        raise UsageError(f"{script} {rec['stopped']} without an optimizer step ({_label(mode, seed)}): compare judges "
                         f"the losses of its optimizer.step() / scaler.step() calls; check its arguments (epochs, "
                         f"max_steps, data) and that it trains in this process")


# ---------------------------------------------------------------------------------------- the child
def main(argv: list[str] | None = None, recorder: Any = None) -> int:
    """The child process: run the script under the switch, write ``run.json``; never raises for the script.

    ``recorder`` (``install()``, ``remove()``, ``on_backward()``, ``on_step(step)``, ``state.recording``,
    ``result(switch)``) watches the run, e.g. :class:`ampkit.verify.script_audit.FirstStepAudit`."""
    import runpy
    import traceback

    import torch

    from ampkit.diagnose.stop import StopRun
    from ampkit.diagnose.runner import script_traceback
    from ampkit.diagnose.switch import Refusal, Switch
    from ampkit.diagnose.tracking import UserCode
    from ampkit.errors import first_line

    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text(encoding="utf-8"))
    c0 = time.process_time()
    full = spec["script"]
    dtype = getattr(torch, spec["dtype"]) if spec["dtype"] else None
    from ampkit.diagnose.step_timer import StepTimer

    timer = StepTimer()

    def on_step(step: int) -> None:
        timer.on_step(step)
        if recorder is not None:
            recorder.on_step(step)

    out = spec["out"]
    rank = {}
    if spec.get("launched"):  # one record per rank; the parent merges them (script_launch.merge_ranks)
        from ampkit.diagnose.script_launch import rank_out

        out, r, world = rank_out(out)
        rank = {"rank": r, "world": world}
    sw = Switch(mode=spec["mode"], seed=spec["seed"], dtype=dtype, steps=spec["steps"],
                distributed=bool(spec.get("launched")), user_dir=os.path.dirname(full),
                on_backward=recorder.on_backward if recorder else None, on_step=on_step)
    timer.switch = sw
    if recorder is not None:
        recorder.switch = sw
    sw.quiet = recorder.state if recorder else None
    rec: dict[str, Any] = {"refusal": None, "error": None, "where": None, "stopped": "finished"}
    user = UserCode(os.path.dirname(full))
    sys.argv = [full, *spec["args"]]
    sys.path[0:1] = [os.path.dirname(full)]
    try:
        with sw:
            if recorder is not None:
                recorder.install()
            try:
                runpy.run_path(full, run_name="__main__")
            finally:
                if recorder is not None:
                    recorder.remove()
    except StopRun as stop:
        rec["stopped"] = str(stop)
    except Refusal as refusal:
        rec["refusal"] = str(refusal)
    except KeyboardInterrupt:  # Ctrl-C reached the script: a stop, not the script's error (never judged)
        rec["stopped"] = "stopped by SIGINT"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            rec["error"] = f"sys.exit({exc.code!r})"
            rec["stopped"] = "exited"
    except BaseException as exc:  # noqa: BLE001 - the script's error is a result, reported in one line
        rec["error"], rec["stopped"] = first_line(exc, 300), "crashed"
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if user.is_user_file(f.filename)]
        if frames:
            rec["where"] = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"
        print(script_traceback(exc, user.is_user_file), file=sys.stderr)
    sys.stdout.flush()
    timing = timer.result()
    rec.update(steps=sw.step, autocast=sorted(sw.autocast_seen), scalers=sw.scalers, scaler_enabled=sw.scaler_enabled,
               **sw.read(), cpu_s=time.process_time() - c0, step_ms=timing["step_ms"], peak_bytes=timing["peak_bytes"],
               switched=sw.dtypes.switched, low_weights=sorted(sw.dtypes.low_weights), **rank)
    if recorder is not None and not rec["refusal"] and not rec["error"]:
        rec["audit"] = recorder.result(sw)
    Path(out).write_text(json.dumps(rec, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
