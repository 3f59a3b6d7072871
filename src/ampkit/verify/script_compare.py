"""``ampkit compare SCRIPT [ARGS...]``: the verdict on the user's own, unmodified training script.

>>> result = ampkit.verify.script_compare.compare_script("train.py", ["--epochs", "1"], seeds=2)  # doctest: +SKIP
>>> result.verdict, result.source["script"]                                                       # doctest: +SKIP
('pass', 'train.py')

Each seed k runs the script twice, each time in a fresh process (:mod:`ampkit.diagnose.script_run`): in FP32
(every autocast region and GradScaler switched off, :mod:`ampkit.diagnose.switch`) and in AMP (as written, or
with ``precision`` forcing the autocast dtype), both with ampkit's seeds for run k. What is judged, by the
same judge as tasks (:func:`ampkit.verify.judge.judge`): the loss of every optimizer step the script takes
(averaged over ``log_every`` steps per curve point), the steps its GradScaler skipped, the FP16 loss scale
(:class:`~ampkit.monitor.ScaleMonitor`), and the final metric: the last match of ``metric`` (a regular
expression whose first group is a number) in the script's output, else the final training loss. Nothing here
prints; ``progress`` gets ``compare_start``, ``run_start``, ``run_end``, ``audit`` and ``report`` events.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ampkit.checkpoint import prepare_folder
from ampkit.device import parse_device
from ampkit.diagnose.script_run import STOPPED_BY, ScriptRun, check_script, run_script
from ampkit.errors import UsageError
from ampkit.device.policy import bf16_advice
from ampkit.verify.band import MARGINS, RunOutcome, seed_reasons
from ampkit.verify.judge import judge
from ampkit.verify.interrupt import Interrupted
from ampkit.verify.compare import TARGET_POINTS, CompareResult, _seed_list, _versions, write_outputs
from ampkit.verify.prior import refuse_existing
from ampkit.verify.script_speed import step_speed
from ampkit.verify.sequential import MAX_SEEDS, Looks, auto_looks, run_until_decided, stopped

__all__ = ["compare_script", "higher_is_better", "metric_name", "window_curve"]

Progress = Callable[[dict[str, Any]], None]
AUDIT_ENTRY = "ampkit.verify.script_audit"  # the child process of an audited run
_HIGHER = re.compile(r"acc|f1|auc|bleu|rouge|score|precision|recall|map\b|iou", re.IGNORECASE)


def higher_is_better(pattern: str, mode: str | None) -> bool:
    """``mode`` ``"max"``/``"min"`` as given; without one, higher is better when the pattern names an accuracy-like
    quantity (acc, f1, auc, bleu, rouge, score, precision, recall, map, iou), else lower (a loss, a perplexity)."""
    if mode is not None:
        if mode not in ("max", "min"):
            raise UsageError(f"--metric-mode takes max or min, got {mode!r}")
        return mode == "max"
    return bool(_HIGHER.search(pattern))


def window_curve(losses: list[float | None], every: int) -> list[list[float | None]]:
    """``[[step, loss], ...]``: the mean finite loss of each ``every`` optimizer steps (None when none was finite),
    at the window's last step (1-based), as the trainer logs a task's curve."""
    curve: list[list[float | None]] = []
    for start in range(0, len(losses), every):
        chunk = [v for v in losses[start:start + every] if v is not None and math.isfinite(v)]
        curve.append([min(start + every, len(losses)), statistics.fmean(chunk) if chunk else None])
    return curve


def metric_name(pattern: str | None) -> str:
    """What the report calls the metric: the pattern's text before its first group ("test accuracy"), taken whole:
    a class escape (``\\s``, ``\\d``) is a space, not a letter ("eval_loss =s"), an escaped character is itself, and
    a leading "final" is dropped because every renderer says "final <metric>" ("final final Loss_D")."""
    if not pattern:
        return "training loss"
    head = pattern.split("(", 1)[0]
    head = re.sub(r"\\[sdwSDWbB]", " ", head)
    head = re.sub(r"\\(.)", r"\1", head)
    head = re.sub(r"[\^$*+?\[\]{}|]", "", head)
    head = re.sub(r"\s+", " ", head).strip(" :=.")
    head = re.sub(r"(?i)^final\s+", "", head).strip(" :=")
    return head or "metric"


def _metric(run: ScriptRun, regex: re.Pattern[str] | None, pattern: str) -> float:
    if regex is None:
        finite = [v for v in run.losses if v is not None and math.isfinite(v)]
        return run.losses[-1] if run.losses and run.losses[-1] is not None else (finite[-1] if finite else math.nan)
    found = regex.findall(run.stdout)
    if not found:
        why = (f"--steps stopped it ({run.stopped}) before it printed one: shorten the script through its own "
               f"arguments instead" if run.stopped.startswith("stopped after") else
               "give a pattern whose first group is the number, e.g. 'test accuracy ([0-9.]+)'")
        raise UsageError(f"--metric {pattern!r} matched nothing in the output of the {run.mode.upper()} run of seed "
                         f"{run.seed} (see {run.folder}/stdout.txt): {why}")
    last = found[-1][0] if isinstance(found[-1], tuple) else found[-1]
    try:
        return float(last)
    except ValueError:
        raise UsageError(f"--metric {pattern!r}: its first group matched {last!r}, not a number") from None


def _warnings(run: ScriptRun, device: str) -> tuple[dict[str, Any], ...]:
    """The ScaleMonitor's ``scale-collapse`` over the run's per-step scales and skips (FP16 with a scaler)."""
    from ampkit.engine.monitor import ScaleMonitor

    if not any(s is not None for s in run.scales):
        return ()
    monitor = ScaleMonitor(advice=bf16_advice(device))
    skipped = 0
    for i, (scale, skip) in enumerate(zip(run.scales, run.skipped), start=1):
        skipped += int(skip or 0)
        if scale is not None and monitor.update(i, scale, skipped) is not None:
            break
    return (asdict(monitor.warning),) if monitor.warning is not None else ()


def _outcome(run: ScriptRun, every: int, final: float, device: str) -> RunOutcome:
    return RunOutcome(curve=window_curve(run.losses, every), final=final, steps=run.steps,
                      skipped=int(sum(s or 0 for s in run.skipped)), warnings=_warnings(run, device))


def _forced(precision: str | None) -> str | None:
    if precision in (None, "auto"):
        return None
    if precision in ("bf16", "fp16"):
        return precision
    if precision == "fp32":
        raise UsageError("nothing to compare: --precision fp32 turns the AMP side off; leave --precision out (the "
                         "script's own autocast) or pass bf16 / fp16")
    raise UsageError(f"--precision {precision} is not available for a script: bf16 or fp16 force the dtype of the "
                     f"script's autocast; leave it out to judge the script as written")


def _amp_label(runs: dict[int, ScriptRun], script: str) -> tuple[str, str]:
    """The AMP precision the AMP runs really ran ("bf16"/"fp16") and its device type, from the autocasts seen."""
    seen = sorted({a for r in runs.values() for a in r.autocast})
    # pure low precision: no autocast, the model converted to BF16/FP16 ("device:dtype" as for autocast)
    seen = seen or sorted({d for r in runs.values() for d in r.low_weights})
    if not seen:
        raise UsageError(f"{script} enables no autocast region (its AMP run computed in FP32, like the FP32 run): "
                         f"nothing to compare; wrap its forward and loss in torch.autocast(device_type, dtype=...)")
    dtypes = {a.split(":")[1] for a in seen}
    name = "fp16" if "float16" in dtypes else "bf16"
    return name, seen[0].split(":")[0]


def compare_script(script: str, args: Sequence[str] = (), *, precision: str | None = None,
                   seeds: int | str | Sequence[int] = 3, max_seeds: int = MAX_SEEDS, steps: int | None = None,
                   log_every: int | None = None,
                   metric: str | None = None, metric_mode: str | None = None, out: str | Path | None = None,
                   run_audit: bool = True, progress: Progress | None = None,
                   tolerance: float | None = None, launch: Any = None) -> CompareResult:
    """Run ``python script *args`` in FP32 and in AMP for each seed (fresh processes); return the verdict.

    Args:
        precision: None / ``"auto"``: the script's own autocast dtype; ``"bf16"`` / ``"fp16"``: forced (FP16
            enables the script's GradScaler).
        seeds: how many seeds (0..N-1), or the seeds; ampkit's seeds replace the script's own. ``"auto"``: seeds
            added until the verdict is decided, at most ``max_seeds`` (:mod:`ampkit.verify.sequential`).
        steps: stop every run after this many optimizer steps (default: the script's own length).
        metric: a regular expression for a final metric the script prints (first group, last match).
        metric_mode: ``"max"`` / ``"min"``: which direction is better (default: :func:`higher_is_better`).
        out: write ``compare.json``, ``report.html``, the PNGs and each run's output (``runs/``) there.
        run_audit: also record the dtype of every op of the script's first step with autocast enabled (one more
            run, stopped after that step).
        tolerance: the harm AMP may do, relative to FP32 (default 1 %): the paired judge of task comparisons.
        launch: a :class:`~ampkit.diagnose.script_launch.Launch`: every run is a launch of several processes
            (torchrun, accelerate launch); the loss of a step is the mean over the ranks.

    Raises :class:`~ampkit.errors.UsageError` (one line) for a missing script, a crash of the script (its own
    error line), ranks that die or disagree, a script that never steps an optimizer or has no low precision,
    and a parameter created in low precision that the FP32 runs cannot keep FP32.
    """
    t0 = time.perf_counter()
    emit = progress or (lambda ev: None)
    full = check_script(script)
    looks = auto_looks(seeds, max_seeds)
    seed_list = _seed_list(seeds if looks is None else looks.last, steps)
    forced = _forced(precision)
    if log_every is not None and log_every < 1:
        raise UsageError(f"--log-every must be >= 1, got {log_every}")
    regex = _compile(metric)
    higher = higher_is_better(metric, metric_mode) if metric else False
    refuse_existing(out, resume=False, script=True)
    tmp = tempfile.TemporaryDirectory(prefix="ampkit-compare-") if out is None else None
    base = (prepare_folder(out) if out is not None else Path(tmp.name)) / "runs"
    try:
        emit({"event": "compare_start", "script": True, "runs": 2 * len(seed_list), "task": script,
              "auto": looks is not None,
              "precision": forced or "amp", "device": None,
              "reason": "the script's own autocast" if forced is None else f"--precision {forced} forced",
              "steps": steps or 0, "seeds": seed_list if looks is None else f"auto ({looks.first} to {looks.last})",
              "fp32_modules": []})
        runs: dict[str, dict[int, ScriptRun]] = {"fp32": {}, "amp": {}}
        total = 2 * len(seed_list)

        def train(seed: int) -> list[str]:
            for side in ("amp", "fp32"):  # AMP first: a script that cannot be compared is told after one run
                count = sum(len(r) for r in runs.values()) + 1
                emit({"event": "run_start", "run": count, "runs": total, "seed": seed, "precision": side,
                      "total": steps or 0})
                with _stopped_in(f"run {count} of {total}", count - 1, "the running one stopped"):
                    run = run_script(full, list(args), mode=side, seed=seed, folder=base / f"{side}-seed{seed}",
                                     precision=forced, steps=steps, launch=launch)
                    _not_stopped(run)
                _metric(run, regex, metric or "")  # a --metric that never matches: refused now, not after 2N runs
                if side == "amp":
                    dev_type = _amp_label({seed: run}, script)[1]  # no autocast region: refused after this run
                runs[side][seed] = run
                emit({"event": "run_end", "run": count, "runs": total, "seed": seed, "precision": side,
                      "wall_s": run.wall_s, "metric": "loss", "value": _safe_last(run),
                      "skipped": int(sum(s or 0 for s in run.skipped))})
            amp_run = runs["amp"][seed]
            return seed_reasons(seed, _outcome(amp_run, max(1, amp_run.steps // TARGET_POINTS), math.nan, dev_type),
                                "AMP")

        def decide(done: list[int]) -> str:
            part = {side: {s: rs[s] for s in done} for side, rs in runs.items()}
            return _judged(script, part, regex, metric, higher, log_every, tolerance, looks)[0].verdict

        stop = None
        if looks is None:
            for seed in seed_list:
                train(seed)
        else:
            used, stop = run_until_decided(seed_list, looks=looks, train=train, decide=decide)
            runs = {side: {s: rs[s] for s in used} for side, rs in runs.items()}
        audit = None
        if run_audit:
            emit({"event": "audit"})
            with _stopped_in("the audit run", sum(len(r) for r in runs.values()), "the audit run stopped"):
                audit = run_script(full, list(args), mode="amp", seed=seed_list[0], folder=base / "audit",
                                   precision=forced, audit=True, entry=AUDIT_ENTRY, launch=launch).audit
        result = _assemble(script, list(args), runs, forced, regex, metric, higher, log_every, audit,
                           base if out is not None else None, t0, tolerance, looks, stop)
        result = _with_reach(result, runs, launch)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if out is not None:
        emit({"event": "report", "out": str(out)})
        result = write_outputs(result, out)
    return result


@contextlib.contextmanager
def _stopped_in(where: str, finished: int, running: str) -> Iterator[None]:
    """A stop signal during a script's run (its process group is already stopped by then) ends the comparison
    with a line that says what was stopped; nothing is judged."""
    try:
        yield
    except Interrupted as stop:
        if " run of seed " in str(stop):  # the run itself said which it was (_not_stopped): that is more precise
            raise
        runs = f"{finished} run{'s' if finished != 1 else ''} finished"
        raise Interrupted(stop.signum, f"during {where} ({runs}, {running})") from None


def _not_stopped(run: ScriptRun) -> None:
    """A run a signal stopped ("stopped by SIGINT") ends the comparison unjudged: :class:`Interrupted`."""
    if run.stopped.startswith(STOPPED_BY):
        name = run.stopped[len("stopped by "):].split()[0]
        signum = signal.Signals.__members__.get(name, signal.SIGINT)
        raise Interrupted(signum, f"during the {run.mode.upper()} run of seed {run.seed}")


def _compile(metric: str | None) -> re.Pattern[str] | None:
    if metric is None:
        return None
    try:
        regex = re.compile(metric)
    except re.error as exc:
        raise UsageError(f"--metric {metric!r} is not a regular expression: {exc}") from None
    if regex.groups < 1:
        raise UsageError(f"--metric {metric!r} needs a group around the number, e.g. 'test accuracy ([0-9.]+)'")
    return regex


def _safe_last(run: ScriptRun) -> float | None:
    finite = [v for v in run.losses if v is not None and math.isfinite(v)]
    return finite[-1] if finite else None


def _assemble(script: str, args: list[str], runs: dict[str, dict[int, ScriptRun]], forced: str | None,
              regex: re.Pattern[str] | None, metric: str | None, higher: bool, log_every: int | None,
              audit: dict[str, Any] | None, base: Path | None, t0: float,
              tolerance: float | None = None, looks: Looks | None = None, stop: str | None = None) -> CompareResult:
    verdict, outcomes, every, steps = _judged(script, runs, regex, metric, higher, log_every, tolerance, looks)
    if looks is not None and stop is not None:
        verdict = stopped(verdict, len(runs["fp32"]), stop)
    name, dev_type = _amp_label(runs["amp"], script)
    label = name.upper()
    dev = parse_device(dev_type)
    amp_has_scaler = any(r.scaler_enabled for r in runs["amp"].values())
    notes = list(verdict.notes)
    notes.append("runs came from the script: each in a fresh process, FP32 by switching every autocast and "
                 "GradScaler off; the loss of a step is the mean of what the script passed to backward")
    if name == "fp16" and not amp_has_scaler:
        notes.append("the FP16 runs had no enabled GradScaler: gradients can underflow to zero (fp16-without-scaler)")
    perf = step_speed(runs, label)
    notes.append(perf["note"])
    scale_trace = None
    if any(v is not None for r in runs["amp"].values() for v in r.scales):
        scale_trace = {s: [[i, v] for i, v in enumerate(r.scales, start=1) if v is not None]
                       for s, r in runs["amp"].items()}
    reason = (f"--precision {forced} forced on the script's autocast" if forced
              else f"the script's own autocast ({', '.join(sorted({a for r in runs['amp'].values() for a in r.autocast}))})")
    all_runs = [r for rs in runs.values() for r in rs.values()]
    source = {"kind": "script", "script": script, "args": args, "forced_precision": forced, "metric": metric,
              "higher_is_better": higher if metric else False, "runs_folder": str(base) if base else None,
              "run_wall_s": {f"{r.mode}-seed{r.seed}": round(r.wall_s, 3) for r in all_runs},
              "run_cpu_s": {f"{r.mode}-seed{r.seed}": round(r.cpu_s, 3) for r in all_runs},
              "stopped": {f"{r.mode}-seed{r.seed}": r.stopped for r in all_runs}}
    return CompareResult(
        verdict=verdict.verdict, reasons=verdict.reasons, warnings=verdict.warnings, notes=tuple(notes),
        task=Path(script).name, task_description="python " + " ".join([script, *args]), precision=name,
        precision_reason=reason, seeds=tuple(runs["fp32"]), steps=steps, log_every=every,
        device={"type": dev.type, "name": dev.name, "str": str(dev)}, versions=_versions(dev),
        curves={side: {s: o.curve for s, o in rs.items()} for side, rs in outcomes.items()},
        band=verdict.band, final_metric=verdict.final_metric, skipped={**verdict.skipped, "steps": steps},
        throughput=perf["throughput"], memory=perf["memory"], ratios=perf["ratios"],
        scale_trace=scale_trace, audit=_audit_summary(audit), margins=dict(MARGINS),
        wall_s=time.perf_counter() - t0, source=source, effects=verdict.effects)


def _judged(script: str, runs: dict[str, dict[int, ScriptRun]], regex: re.Pattern[str] | None, metric: str | None,
            higher: bool, log_every: int | None, tolerance: float | None, looks: Looks | None):
    """(the verdict, the runs' outcomes, steps per curve point, the longest run's steps) of these runs."""
    name, dev_type = _amp_label(runs["amp"], script)
    steps = max(r.steps for side in runs.values() for r in side.values())
    every = log_every or max(1, steps // TARGET_POINTS)
    finals = {side: {s: _metric(r, regex, metric or "") for s, r in rs.items()} for side, rs in runs.items()}
    outcomes = {side: {s: _outcome(r, every, finals[side][s], dev_type) for s, r in rs.items()}
                for side, rs in runs.items()}
    verdict = judge(label=name.upper(), fp32=outcomes["fp32"], amp=outcomes["amp"], metric=metric_name(metric),
                    higher_is_better=higher, tolerance=tolerance, looks=looks,
                    bf16_advice=bf16_advice(parse_device(dev_type)) if name == "fp16" else None)
    return verdict, outcomes, every, steps


def _with_reach(result: CompareResult, runs: dict[str, dict[int, ScriptRun]], launch: Any) -> CompareResult:
    """The launch and the pure-low-precision switching, in the notes and ``source`` of the result."""
    from dataclasses import replace

    notes, source = list(result.notes), dict(result.source)
    described = result.task_description
    if launch is not None:
        described = " ".join([launch.describe(), source["script"], *source["args"]])
        ranks = max(r.ranks for rs in runs.values() for r in rs.values())
        notes.append(f"every run was `{launch.describe()}` with {ranks} processes, the precision switched in each "
                     f"rank; the loss of a step is the mean over the ranks (each rank's record merged at the end)")
        source.update(launch=launch.describe(), ranks=ranks)
    switched = {k: v for r in runs["fp32"].values() for k, v in r.switched.items()}
    if switched:
        what = "; ".join(f"{k} ({v}x)" if v > 1 else k for k, v in list(switched.items())[:6])
        notes.append(f"pure low precision: the FP32 runs kept FP32 what the script converts to low precision, "
                     f"those conversions made no-ops: {what}" + (" ..." if len(switched) > 6 else ""))
        source["switched"] = switched
    low = sorted({d.split(":")[-1] for r in runs["amp"].values() for d in r.low_weights})
    if low:
        source["low_weights"] = low
        if not any(r.autocast for r in runs["amp"].values()):
            reason = f"the script's own {'/'.join(low)} weights (pure low precision, no autocast)"
            return replace(result, notes=tuple(notes), source=source, precision_reason=reason,
                           task_description=described)
    return replace(result, notes=tuple(notes), source=source, task_description=described)


def _audit_summary(audit: dict[str, Any] | None) -> dict[str, Any] | None:
    if audit is None or "unrecorded" in audit:
        return None
    from ampkit.verify.audit import audit_from_dict

    return audit_from_dict(audit).summary()


def audit_script(script: str, args: Sequence[str] = (), *, precision: str | None = None, mode: str = "amp"):
    """``ampkit audit SCRIPT``: the :class:`~ampkit.verify.audit.AuditResult` of the script's first optimizer
    step in which autocast is enabled (forward under its autocast, and its backward; an FP32 phase before it is
    skipped), recorded in a fresh process with seed 0. ``mode="fp32"``
    audits the FP32 run of ``compare SCRIPT`` instead (every autocast and GradScaler switched off)."""
    from ampkit.verify.audit import audit_from_dict

    full = check_script(script, "audit")
    forced = _forced(precision) if mode == "amp" else None
    with tempfile.TemporaryDirectory(prefix="ampkit-audit-") as tmp:
        run = run_script(full, list(args), mode=mode, seed=0, folder=tmp, precision=forced, audit=True,
                         entry=AUDIT_ENTRY)
    if run.audit is None:
        raise UsageError(f"{script} took an optimizer step without running an nn.Module: nothing to audit")
    if "unrecorded" in run.audit:
        raise UsageError(f"{script} enables no autocast region: {run.audit['unrecorded']}; wrap its forward and loss "
                         f"in torch.autocast(device_type, dtype=...)")
    return audit_from_dict(run.audit)
