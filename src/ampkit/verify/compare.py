"""FP32 against AMP on the same seeds, initial weights and data order, with a verdict.

>>> import ampkit
>>> result = ampkit.compare("digits", precision="bf16", seeds=3)      # doctest: +SKIP
>>> result.verdict, result.reasons                                     # doctest: +SKIP
('pass', ())
>>> result.ratios                                                      # doctest: +SKIP
{'speedup': 1.8, 'memory_saving': None}

What is run: for each seed, the task is built once, its initial weights are copied, and it is trained
in FP32 and then, from those same weights and the same ``batch(step)`` stream, in the AMP precision.
Both runs use the trainer (:func:`ampkit.trainer.train`) with evaluation on.

How the verdict is reached (the margins are module constants, documented in docs/commands/compare.md under "The verdict"):

* **Loss band.** At every logged step the FP32 seeds give ``lo`` (min), ``hi`` (max) and a spread
  estimate ``sigma = (hi - lo) / d2(n)`` (Shewhart's range estimator: ``d2(2) = 1.128``,
  ``d2(3) = 1.693``; the sample standard deviation above 10 seeds). The band is widened by
  ``margin = max(BAND_SIGMAS * sigma, BAND_REL * |mean|)``: two more sigmas above the highest of
  a few seeds is a level a fresh FP32 seed exceeds well under 1 % of the time, and the relative
  floor covers the late steps where seeds agree so closely that ``sigma`` is tiny.
  The AMP curve of every seed **diverges at step k** when its loss is above ``hi + margin`` from
  step k to the end of the run (at least ``MIN_OUT_POINTS`` logged points: a last-step blip does not
  count), or **non-finite at step k** when every loss of a logging window was NaN/Inf. A curve
  *below* the band is reported as a warning, not a failure: it is better, not harmed.
* **Final metric.** The task's metric (e.g. test accuracy; the final training loss when the task has
  none) is judged on the mean over AMP seeds against the FP32 seeds' range widened by
  ``METRIC_ABS`` (one percentage point) for rates in [0, 1], else ``METRIC_REL`` (2 %) of the FP32
  mean. Only the harmful direction fails.
* **Skipped steps.** More than ``MAX_SKIP_SHARE`` (5 %) of any AMP run's optimizer steps skipped
  (non-finite gradients) fails.
* **Scale collapse.** The trainer's :class:`~ampkit.monitor.ScaleMonitor` warning ``scale-collapse``
  in any FP16 run fails, with its fix.

Speed and memory are measured in the same process on the same device (samples/s from the trainer,
first logging window excluded; peak memory where the device tracks it, ``None`` on the CPU). They
are reported as ratios and never change the verdict.
"""

from __future__ import annotations

import copy
import inspect
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ampkit.checkpoint import prepare_folder
from ampkit.device import Device, detect_device
from ampkit.errors import AmpkitError, UsageError
from ampkit.policy import Precision, resolve_precision
from ampkit.tasks import Task, load_task
from ampkit.trainer import TrainConfig, TrainResult, train

__all__ = ["compare", "CompareResult", "band", "BAND_SIGMAS", "BAND_REL", "METRIC_ABS", "METRIC_REL",
           "MAX_SKIP_SHARE", "MIN_OUT_POINTS", "write_outputs"]

BAND_SIGMAS = 2.0
BAND_REL = 0.10
METRIC_ABS = 0.01
METRIC_REL = 0.02
MAX_SKIP_SHARE = 0.05
MIN_OUT_POINTS = 3
TARGET_POINTS = 40  # logged points per curve when log_every is not given

# Shewhart's d2(n): expected range of n standard normal samples.
_D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}

Progress = Callable[[dict[str, Any]], None]
TaskFactory = Callable[..., Task] | str


@dataclass(frozen=True, kw_only=True)
class CompareResult:
    """The verdict and everything behind it. ``to_dict()`` is what ``compare.json`` holds."""

    verdict: str  # "pass" | "fail"
    reasons: tuple[str, ...]
    warnings: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    task: str
    task_description: str
    precision: str
    precision_reason: str
    seeds: tuple[int, ...]
    steps: int
    log_every: int
    device: dict[str, Any]
    versions: dict[str, Any]
    curves: dict[str, dict[int, list[list[float | None]]]]
    band: dict[str, Any]
    final_metric: dict[str, Any]
    throughput: dict[str, Any]
    memory: dict[str, Any]
    ratios: dict[str, float | None]
    skipped: dict[str, Any]
    scale_trace: dict[int, list[list[float]]] | None
    audit: dict[str, Any] | None
    margins: dict[str, float]
    wall_s: float
    report: str | None = None
    files: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["curves"] = {k: {str(s): v for s, v in c.items()} for k, c in self.curves.items()}
        if self.scale_trace is not None:
            d["scale_trace"] = {str(s): v for s, v in self.scale_trace.items()}
        d["reasons"], d["warnings"], d["notes"], d["seeds"], d["files"] = (
            list(self.reasons), list(self.warnings), list(self.notes), list(self.seeds), list(self.files))
        return _finite_or_none(d)


def _finite_or_none(obj: Any) -> Any:
    """NaN/Inf become None so that compare.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------- the band
def band(curves: dict[int, list[list[float | None]]]) -> dict[str, list[float | None]]:
    """Per logged step of the FP32 curves: ``steps, lo, hi, mean, sigma, margin, upper, lower``.

    ``upper``/``lower`` are the widened band the AMP curve is judged against (module docstring).
    A step where any FP32 seed was non-finite gets None everywhere.
    """
    seeds = list(curves)
    steps = [int(p[0]) for p in curves[seeds[0]]]
    out: dict[str, list[float | None]] = {k: [] for k in ("lo", "hi", "mean", "sigma", "margin", "upper", "lower")}
    out["steps"] = steps  # type: ignore[assignment]
    by_seed = {s: {int(p[0]): p[1] for p in curves[s]} for s in seeds}
    for step in steps:
        vals = [by_seed[s].get(step) for s in seeds]
        if any(v is None or not math.isfinite(v) for v in vals):
            for k in ("lo", "hi", "mean", "sigma", "margin", "upper", "lower"):
                out[k].append(None)
            continue
        lo, hi, mean = min(vals), max(vals), statistics.fmean(vals)
        n = len(vals)
        if n == 1:
            sigma = 0.0
        elif n in _D2:
            sigma = (hi - lo) / _D2[n]
        else:
            sigma = statistics.stdev(vals)
        margin = max(BAND_SIGMAS * sigma, BAND_REL * abs(mean))
        for k, v in (("lo", lo), ("hi", hi), ("mean", mean), ("sigma", sigma), ("margin", margin),
                     ("upper", hi + margin), ("lower", lo - margin)):
            out[k].append(v)
    return out


def _judge_curve(seed: int, curve: list[list[float | None]], b: dict[str, list], label: str
                 ) -> tuple[str | None, str | None]:
    """(failure reason or None, below-band warning or None) for one AMP curve."""
    upper = dict(zip(b["steps"], b["upper"]))
    lower = dict(zip(b["steps"], b["lower"]))
    for step, loss in curve:
        if loss is None or not math.isfinite(loss):
            return f"{label} loss became non-finite at step {int(step)} (seed {seed})", None
    points = [(int(s), v, upper.get(int(s)), lower.get(int(s))) for s, v in curve]
    points = [p for p in points if p[2] is not None]
    if not points:
        return None, None

    def run_from_end(pred) -> int:
        n = 0
        for p in reversed(points):
            if not pred(p):
                break
            n += 1
        return n

    need = min(MIN_OUT_POINTS, len(points))
    above = run_from_end(lambda p: p[1] > p[2])
    if above >= need:
        step, v, up, _ = points[len(points) - above]
        last = points[-1]
        return (f"{label} diverged at step {step} (seed {seed}): its loss left the FP32 band for good "
                f"({v:.4g} > {up:.4g}; at the end {last[1]:.4g} > {last[2]:.4g})"), None
    below = run_from_end(lambda p: p[1] < p[3])
    if below >= need:
        step = points[len(points) - below][0]
        return None, (f"{label} loss is below the FP32 band from step {step} to the end (seed {seed}): better "
                      f"than every FP32 seed, which is unusual; run more --seeds to be sure")
    return None, None


def _merge_seeds(reasons: list[str]) -> list[str]:
    """``"... at step 1 (seed 0)"`` and ``"... at step 1 (seed 1)"`` become ``"... at step 1 (seeds 0, 1)"``."""
    groups: dict[str, list[str]] = {}
    order: list[str] = []
    for text in reasons:
        head, sep, tail = text.partition(" (seed ")
        seed, _, rest = tail.partition(")")
        key = head + "\0" + rest if sep else text
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(seed if sep else "")
    out = []
    for key in order:
        seeds = groups[key]
        if "\0" not in key:
            out.append(key)
            continue
        head, rest = key.split("\0", 1)
        out.append(f"{head} (seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}){rest}")
    return out


def _metric_margin(name: str, values: list[float]) -> tuple[float, str]:
    if values and all(0.0 <= v <= 1.0 for v in values) and name != "loss" and "loss" not in name:
        return METRIC_ABS, f"{METRIC_ABS * 100:g} percentage point"
    mean = statistics.fmean(values) if values else 0.0
    return METRIC_REL * abs(mean), f"{METRIC_REL * 100:g}% of the FP32 mean"


def _judge_metric(name: str, higher_is_better: bool, fp32: list[float], amp: list[float], label: str
                  ) -> tuple[str | None, dict[str, Any]]:
    info: dict[str, Any] = {"name": name, "higher_is_better": higher_is_better, "fp32": fp32, "amp": amp}
    if not fp32 or not amp:
        info["allowed"] = None
        return None, info
    if any(not math.isfinite(v) for v in amp):
        return f"final {name} of {label} is not finite ({amp})", info
    margin, margin_text = _metric_margin(name, fp32)
    lo, hi = min(fp32), max(fp32)
    f_mean, a_mean = statistics.fmean(fp32), statistics.fmean(amp)
    info.update(margin=margin, margin_text=margin_text, fp32_mean=f_mean, amp_mean=a_mean,
                allowed=[lo - margin, hi + margin])
    span = f"FP32 seeds {lo:.4g}..{hi:.4g}"
    if higher_is_better and a_mean < lo - margin:
        return (f"final {name} lower by {f_mean - a_mean:.3g} ({label} {a_mean:.4g} vs FP32 {f_mean:.4g}; "
                f"{span}, allowed down to {lo - margin:.4g})"), info
    if not higher_is_better and a_mean > hi + margin:
        return (f"final {name} higher by {a_mean - f_mean:.3g} ({label} {a_mean:.4g} vs FP32 {f_mean:.4g}; "
                f"{span}, allowed up to {hi + margin:.4g})"), info
    return None, info


# ---------------------------------------------------------------------------------------- running
def _task_maker(task_factory: TaskFactory, options: dict[str, Any] | None) -> Callable[[int], Task]:
    if isinstance(task_factory, str):
        return lambda seed: load_task(task_factory, seed=seed, options=options)
    if not callable(task_factory):
        raise UsageError(f"task_factory must be a factory(seed=...) -> ampkit.Task or a task spec string, "
                         f"got {type(task_factory).__name__}")
    params = inspect.signature(task_factory).parameters
    takes_seed = "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    def make(seed: int) -> Task:
        torch.manual_seed(seed)  # initial weights depend on the seed alone, as in load_task
        task = task_factory(seed=seed, **(options or {})) if takes_seed else task_factory(**(options or {}))
        if not isinstance(task, Task):
            raise UsageError(f"the task factory returned {type(task).__name__}, not an ampkit.Task")
        return task

    return make


def _curve(result: TrainResult) -> list[list[float | None]]:
    return [[int(r["step"]), r["loss"]] for r in result.history]


def _final_value(task: Task, result: TrainResult) -> tuple[str, float | None]:
    if task.metric and task.metric in result.metrics:
        return task.metric, result.metrics[task.metric]
    return "training loss", result.final_loss if result.final_loss is not None else float("nan")


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _bf16_available(device: Device) -> bool:
    try:
        resolve_precision("bf16", device)
        return True
    except AmpkitError:
        return False


def compare(task_factory: TaskFactory = "digits", *, precision: Precision | str = "auto",
            seeds: int | Sequence[int] = 3, steps: int | None = None, log_every: int | None = None,
            device: Device | str | None = None, task_options: dict[str, Any] | None = None,
            lr: float | None = None, run_audit: bool = True, out: str | Path | None = None,
            progress: Progress | None = None) -> CompareResult:
    """Train in FP32 and in ``precision`` from the same seeds, weights and data; return the verdict.

    Args:
        task_factory: a task spec (``"digits"``, ``"FILE.py:factory"``, ``"module:factory"``) or a
            callable ``factory(seed=...) -> ampkit.Task``.
        precision: the AMP precision to judge (``"auto"``: the device's recommended low precision).
        seeds: how many seeds (0..N-1), or the seeds themselves. Two or more give a measured spread.
        steps: optimizer steps per run (default: the task's ``default_steps``).
        log_every: steps per point of the loss curves (default: about 40 points per curve).
        out: when given, write ``compare.json``, ``report.html`` and the PNG plots there.
        progress: called with event dicts (``compare_start``, ``run_start``, the trainer's events
            with a ``run`` key, ``run_end``, ``audit``, ``report``); nothing here prints.

    Raises :class:`~ampkit.errors.UsageError` when ``precision`` is (or resolves to) FP32: there is
    nothing to compare against.

    >>> result = ampkit.compare("digits", precision="bf16", seeds=2, steps=20, log_every=5)   # doctest: +SKIP
    >>> result.verdict, result.reasons                                                     # doctest: +SKIP
    ('pass', ())
    """
    t0 = time.perf_counter()
    emit = progress or (lambda ev: None)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise UsageError("--seeds must be at least 1 (2 or more measure the seed-to-seed spread)")
    if len(set(seed_list)) != len(seed_list):
        raise UsageError(f"seeds must be distinct, got {seed_list}")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be positive, got {steps}")
    if out is not None:
        prepare_folder(out)  # before minutes of training, not after
    if isinstance(precision, Precision):
        amp_prec = precision
        dev = precision.device
    else:
        dev = device if isinstance(device, Device) else detect_device(device)
        amp_prec = resolve_precision(precision, dev)
    if not amp_prec.is_low_precision:
        why = "you asked for fp32" if str(precision) == "fp32" else amp_prec.reason
        raise UsageError(f"nothing to compare: the AMP side resolved to FP32 ({why}); "
                         "pass --precision bf16 or fp16")
    fp32_prec = resolve_precision("fp32", dev)
    make = _task_maker(task_factory, task_options)
    label = amp_prec.name.upper()

    first_task = make(seed_list[0])
    total_steps = steps or first_task.default_steps
    every = log_every or max(1, total_steps // TARGET_POINTS)
    runs = 2 * len(seed_list)
    emit({"event": "compare_start", "runs": runs, "task": first_task.name, "precision": amp_prec.name,
          "reason": amp_prec.reason, "device": str(dev), "steps": total_steps, "seeds": seed_list})

    results: dict[str, dict[int, TrainResult]] = {"fp32": {}, "amp": {}}
    finals: dict[str, list[float]] = {"fp32": [], "amp": []}
    metric_name = "training loss"
    run_idx = 0
    for i, seed in enumerate(seed_list):
        task = first_task if i == 0 else make(seed)
        init = copy.deepcopy(task.model.state_dict())
        for side, prec in (("fp32", fp32_prec), ("amp", amp_prec)):
            if side == "amp":
                task = make(seed)
                task.model.load_state_dict(init)  # the same initial weights, whatever the factory does
            run_idx += 1
            emit({"event": "run_start", "run": run_idx, "runs": runs, "seed": seed, "precision": prec.name,
                  "total": total_steps})
            config = TrainConfig(task=task.name, precision=prec.name, steps=total_steps, seed=seed,
                                 log_every=every, evaluate=True, lr=lr, max_consecutive_skips=None)

            def fwd(ev: dict[str, Any], _run: int = run_idx) -> None:
                emit({**ev, "run": _run})

            result = train(config, task=task, precision=prec, progress=fwd)
            results[side][seed] = result
            metric_name, value = _final_value(task, result)
            finals[side].append(float(value) if value is not None else float("nan"))
            emit({"event": "run_end", "run": run_idx, "runs": runs, "seed": seed, "precision": prec.name,
                  "wall_s": result.wall_s, "metric": metric_name, "value": value, "skipped": result.skipped})

    reasons: list[str] = []
    warnings: list[dict[str, Any]] = []
    notes: list[str] = []
    curves = {side: {s: _curve(r) for s, r in results[side].items()} for side in results}
    for s, r in results["fp32"].items():
        bad = next((p[0] for p in curves["fp32"][s] if p[1] is None), None)
        if bad is not None:
            reasons.append(f"the FP32 reference itself became non-finite at step {bad} (seed {s}): fix the task "
                           "(learning rate, data) before judging precisions")
    b = band(curves["fp32"])
    if len(seed_list) == 1:
        notes.append("one seed: no seed-to-seed spread measured, the band is the relative margin alone; "
                     "use --seeds 3")
    curve_reasons = []
    for s in seed_list:
        reason, below = _judge_curve(s, curves["amp"][s], b, label)
        if reason:
            curve_reasons.append(reason)
        if below:
            warnings.append({"code": "below-band", "message": below, "fix": "", "seeds": [s]})
    reasons += _merge_seeds(curve_reasons)

    skipped = {"amp": {s: r.skipped for s, r in results["amp"].items()},
               "fp32": {s: r.skipped for s, r in results["fp32"].items()},
               "steps": total_steps, "max_share": MAX_SKIP_SHARE}
    skip_bad = {s: r for s, r in results["amp"].items() if r.skipped / max(r.steps, 1) > MAX_SKIP_SHARE}
    if skip_bad:
        worst = max(r.skipped / max(r.steps, 1) for r in skip_bad.values())
        detail = ", ".join(f"seed {s}: {r.skipped} of {r.steps}" for s, r in skip_bad.items())
        reasons.append(f"{worst:.0%} of {label} steps skipped ({detail}; more than {MAX_SKIP_SHARE:.0%} fails): "
                       "their gradients were not finite")

    bf16_here = _bf16_available(dev) if amp_prec.use_scaler else False
    collapsed: list[tuple[int, dict[str, Any]]] = []
    for s, r in results["amp"].items():
        for w in r.warnings:
            fix = w.get("fix", "")
            if w.get("code") == "scale-collapse" and bf16_here and "bf16" not in fix:
                fix = "use --precision bf16 (this device has BF16: no loss scaling needed); or " + fix
            same = next((x for x in warnings if x.get("code") == w.get("code") and x.get("message") == w.get("message")),
                        None)
            if same is not None:  # the same warning from several seeds: one entry with their seeds
                same["seeds"].append(s)
            else:
                warnings.append({**w, "fix": fix, "seeds": [s]})
            if w.get("code") == "scale-collapse":
                collapsed.append((s, {**w, "fix": fix}))
    if collapsed:
        _, w0 = collapsed[0]
        seeds_txt = ", ".join(str(s) for s, _ in collapsed)
        reasons.append(f"scale collapsed (seed{'s' if len(collapsed) > 1 else ''} {seeds_txt}): "
                       f"{w0['message']}. fix: {w0['fix']}")

    higher = first_task.higher_is_better if metric_name != "training loss" else False
    metric_reason, metric_info = _judge_metric(metric_name, higher, finals["fp32"], finals["amp"], label)
    if metric_reason:
        reasons.append(metric_reason)

    # Speed and memory: measured here, reported as ratios, never part of the verdict.
    sps = {side: _median([r.samples_per_s for r in results[side].values()]) for side in results}
    peaks = {side: [r.peak_mem_bytes for r in results[side].values()] for side in results}
    peak = {side: (max(v) if v and all(x is not None for x in v) else None) for side, v in peaks.items()}
    speedup = sps["amp"] / sps["fp32"] if sps["amp"] and sps["fp32"] else None
    saving = 1.0 - peak["amp"] / peak["fp32"] if peak["amp"] and peak["fp32"] else None
    if peak["fp32"] is None:
        notes.append(f"peak memory: n/a on {dev.type.upper()} (torch does not track these allocations)")
    if speedup is not None and speedup < 1.0:
        extra = " (CPU autocast often is: the casts cost more than the low-precision kernels save)" \
            if not dev.is_accelerator else ""
        notes.append(f"{label} was slower than FP32 here: {speedup:.2f}x the samples/s{extra}")
    scale_trace = None
    if amp_prec.use_scaler:
        scale_trace = {s: [[int(h["step"]), float(h["scale"])] for h in r.history] for s, r in results["amp"].items()}

    audit_summary = None
    if run_audit:
        emit({"event": "audit"})
        try:
            from ampkit.verify.audit import audit_task

            audit_summary = audit_task(make(seed_list[0]), precision=amp_prec).summary()
        except Exception as exc:  # noqa: BLE001 - the audit is extra information, not the verdict
            notes.append(f"audit failed: {type(exc).__name__}: {exc}")

    versions = dict(dev.runtime_versions())
    from ampkit import __version__

    versions.update(ampkit=__version__, python=platform.python_version())
    result = CompareResult(
        verdict="fail" if reasons else "pass",
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        notes=tuple(notes),
        task=first_task.name,
        task_description=first_task.description,
        precision=amp_prec.name,
        precision_reason=amp_prec.reason,
        seeds=tuple(seed_list),
        steps=total_steps,
        log_every=every,
        device={"type": dev.type, "name": dev.name, "str": str(dev)},
        versions=versions,
        curves=curves,
        band=b,
        final_metric=metric_info,
        throughput={"fp32": sps["fp32"], "amp": sps["amp"], "unit": "samples/s",
                    "per_seed": {side: {s: r.samples_per_s for s, r in results[side].items()} for side in results}},
        memory={"fp32": peak["fp32"], "amp": peak["amp"], "unit": "bytes"},
        ratios={"speedup": speedup, "memory_saving": saving},
        skipped=skipped,
        scale_trace=scale_trace,
        audit=audit_summary,
        margins={"band_sigmas": BAND_SIGMAS, "band_rel": BAND_REL, "metric_abs": METRIC_ABS,
                 "metric_rel": METRIC_REL, "max_skip_share": MAX_SKIP_SHARE, "min_out_points": MIN_OUT_POINTS},
        wall_s=time.perf_counter() - t0,
    )
    if out is not None:
        emit({"event": "report", "out": str(out)})
        result = write_outputs(result, out)
    return result


def write_outputs(result: CompareResult, out: str | Path) -> CompareResult:
    """Write ``compare.json``, ``report.html`` and the PNGs into ``out``; return the result with their paths."""
    import json

    from ampkit.verify.report import write_report

    folder = prepare_folder(out)
    html, pngs = write_report(result, folder)
    result = replace(result, report=str(html), files=tuple(str(p) for p in [folder / "compare.json", html, *pngs]))
    (folder / "compare.json").write_text(json.dumps(result.to_dict(), indent=2, default=str, allow_nan=False) + "\n", encoding="utf-8")
    return result
