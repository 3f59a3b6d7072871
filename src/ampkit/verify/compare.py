"""FP32 against AMP on the same seeds, initial weights and data order, with a verdict.

>>> import ampkit
>>> result = ampkit.compare("digits", precision="bf16", seeds=3)      # doctest: +SKIP
>>> result.verdict, result.reasons                                     # doctest: +SKIP
('pass', ())
>>> result.ratios                                                      # doctest: +SKIP
{'speedup': 1.8, 'memory_saving': None}

What is run: for each seed, the task is built once, its initial weights are copied, and it is trained
in FP32 and then, from those same weights and the same ``batch(step)`` stream, in the AMP precision.
Both runs use the trainer (:func:`ampkit.training.trainer.train`) with evaluation on.

How the verdict is reached: :func:`ampkit.verify.judge.judge`, a paired equivalence test over the
seeds (pure functions; docs/commands/compare.md, "The verdict").

With ``fp32_modules`` the AMP runs keep those modules in FP32 (:mod:`ampkit.engine.regions`), and the cost of
each region (step time and peak memory with and without it) is measured and reported. With
``explain=True``, :mod:`ampkit.verify.explain` ranks the modules by the error they add and, after a
FAIL, tries fixes with short reruns (``CompareResult.explain``).

Speed and memory are measured in the same process on the same device (samples/s from the trainer,
first logging window excluded; peak memory where the device tracks it, ``None`` on the CPU). They
are reported as ratios and never change the verdict.
"""


from __future__ import annotations

import itertools
import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ampkit.checkpoint import prepare_folder
from ampkit.device import Device, detect_device
from ampkit.errors import AmpkitError, UsageError
from ampkit.device.policy import Precision, bf16_advice, resolve_precision
from ampkit.tasks import Task, load_task
from ampkit.verify.band import MARGINS
from ampkit.verify.judge import SETTINGS, Verdict, judge
from ampkit.verify.prior import SCHEMA, load_prior, refuse_existing, run_record, settings
from ampkit.verify.result import CompareResult
from ampkit.training.speed import describe, speed_ratio
from ampkit.verify.runs import Run, RunPlan, median, outcome
from ampkit.verify.sequential import MAX_SEEDS, Looks, auto_looks, run_auto, stopped

__all__ = ["compare", "CompareResult", "judge_runs", "write_outputs"]

TARGET_POINTS = 40  # logged points per curve when log_every is not given

Progress = Callable[[dict[str, Any]], None]
TaskFactory = Callable[..., Task] | str


# ---------------------------------------------------------------------------------------- set-up
def _task_maker(task_factory: TaskFactory, options: dict[str, Any] | None, dev: Device) -> Callable[[int], Task]:
    if not isinstance(task_factory, str) and not callable(task_factory):
        raise UsageError(f"task_factory must be a factory(seed=...) -> ampkit.Task or a task spec string, "
                         f"got {type(task_factory).__name__}")
    return lambda seed: load_task(task_factory, seed=seed, options=options, device=dev.torch_device)


def _seed_list(seeds: int | Sequence[int], steps: int | None) -> list[int]:
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise UsageError("--seeds must be at least 1 (3 or more can show AMP within the tolerance)")
    if len(set(seed_list)) != len(seed_list):
        raise UsageError(f"seeds must be distinct, got {seed_list}")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be positive, got {steps}")
    return seed_list


def _precisions(precision: Precision | str, device: Device | str | None) -> tuple[Precision, Precision]:
    """(FP32, AMP), resolved once for every run of the comparison."""
    if isinstance(precision, Precision):
        amp = precision
    else:
        amp = resolve_precision(precision, device if isinstance(device, Device) else detect_device(device))
    if not amp.is_low_precision:
        why = "you asked for fp32" if str(precision) == "fp32" else amp.reason
        raise UsageError(f"nothing to compare: the AMP side resolved to FP32 ({why}); pass --precision bf16 or fp16")
    return resolve_precision("fp32", amp.device), amp


def _fp32_modules(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    from ampkit.engine.regions import normalize_fp32_modules

    specs = normalize_fp32_modules(value)
    bad = [s for s in specs if not isinstance(s, str)]
    if bad:  # types cannot go into compare.json or a command line: their names can
        raise UsageError(f"compare takes fp32_modules as names, globs or presets, not types ({bad[0].__name__}): "
                         f"use a glob over the module names or 'preset:norm'")
    return tuple(specs)


# ---------------------------------------------------------------------------------------- running
def _run_all(plan: RunPlan, fp32_modules: tuple[str, ...], emit: Progress, notes: list[str], first: int = 1,
             total: int | None = None) -> dict[str, dict[int, Run]]:
    """Every seed in FP32 and then in the AMP precision from the same initial weights.

    Both precisions train the same way: where one replayed its step as a device graph and the other could not
    (FP8 layers, a host read under autocast only), the graphed runs are trained again with eager steps and the
    rest run eagerly, so the speed-up compares precisions, not launch overheads; ``notes`` says why.
    """
    runs: dict[str, dict[int, Run]] = {"fp32": {}, "amp": {}}
    total = total or 2 * len(plan.seeds)  # run numbers first.. of total (--seeds auto: one seed per call)
    count = itertools.count(first)

    def one(seed: int, side: str) -> None:
        prec = plan.fp32 if side == "fp32" else plan.amp
        idx = next(count)
        emit({"event": "run_start", "run": idx, "runs": total, "seed": seed, "precision": prec.name,
              "total": plan.steps})

        def fwd(ev: dict[str, Any], _run: int = idx) -> None:
            emit({**ev, "run": _run})

        _, run = plan.run(seed, prec, fp32_modules=fp32_modules if side == "amp" else (), progress=fwd)
        runs[side][seed] = run
        emit({"event": "run_end", "run": idx, "runs": total, "seed": seed, "precision": prec.name,
              "wall_s": run.result.wall_s, "metric": run.metric, "value": run.final, "skipped": run.result.skipped})

    for seed in plan.seeds:
        for side in ("fp32", "amp"):
            one(seed, side)
        graphed = {side: runs[side][seed].result.step_graph for side in runs}
        if plan.graph is not False and graphed["fp32"] != graphed["amp"]:
            eager_side = "fp32" if not graphed["fp32"] else "amp"
            why = runs[eager_side][seed].result.step_graph_fallback or "the step could not be captured"
            label = (plan.fp32 if eager_side == "fp32" else plan.amp).name.upper()
            notes.append(f"{label} could not run as one device graph ({why}): both precisions trained with eager "
                         f"steps, so the speed-up compares precisions, not launch overheads")
            plan.graph = False
            total += sum(1 for side in runs for r in runs[side].values() if r.result.step_graph)
            for side in runs:
                for done_seed in [s for s, r in runs[side].items() if r.result.step_graph]:
                    one(done_seed, side)
    return runs


def _perf(runs: dict[str, dict[int, Run]], dev: Device, label: str) -> tuple[dict, dict, dict, list[str]]:
    """Throughput, memory, ratios and notes: measured here, never part of the verdict."""
    sps = {side: median([r.result.samples_per_s for r in runs[side].values()]) for side in runs}
    peaks = {side: [r.result.peak_mem_bytes for r in runs[side].values()] for side in runs}
    peak = {side: (max(v) if v and all(x is not None for x in v) else None) for side, v in peaks.items()}
    # Seed s in AMP over seed s in FP32 (they ran back to back): the median and the spread across seeds.
    ratio = speed_ratio([runs["amp"][s].result.samples_per_s if s in runs["amp"] else None for s in runs["fp32"]],
                        [r.result.samples_per_s for r in runs["fp32"].values()])
    speedup = ratio.median
    saving = 1.0 - peak["amp"] / peak["fp32"] if peak["amp"] and peak["fp32"] else None
    notes = []
    if peak["fp32"] is None:
        notes.append(f"peak memory: n/a on {dev.type.upper()} (torch does not track these allocations)")
    if ratio.within_noise:  # no cause is given: none was measured
        notes.append(f"speed-up {ratio.text()}: the seeds do not agree on faster or slower on this machine")
    elif speedup is not None and speedup < 1.0:
        notes.append(f"{label} was slower than FP32 here: samples/s {ratio.text()}")
    throughput = {"fp32": sps["fp32"], "amp": sps["amp"], "unit": "samples/s",
                  "per_seed": {side: {s: r.result.samples_per_s for s, r in runs[side].items()} for side in runs}}
    return (throughput, {"fp32": peak["fp32"], "amp": peak["amp"], "unit": "bytes"},
            {"speedup": speedup, "speedup_spread": ratio.to_dict(), "memory_saving": saving}, notes)


def _audit(plan: RunPlan, fp32_modules: tuple[str, ...], notes: list[str]) -> dict[str, Any] | None:
    from ampkit.verify.audit import audit_task

    try:
        return audit_task(plan.make(plan.seeds[0]), precision=plan.amp, fp32_modules=fp32_modules).summary()
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the audit is extra information, not the verdict
        from ampkit.errors import first_line

        notes.append(f"audit failed: {first_line(exc)}")
        return None


def _versions(dev: Device) -> dict[str, Any]:
    from ampkit import __version__

    versions = dict(dev.runtime_versions())
    versions.update(ampkit=__version__, python=platform.python_version())
    return versions


def compare(task_factory: TaskFactory = "digits", *, precision: Precision | str = "auto",
            seeds: int | str | Sequence[int] = 3, max_seeds: int = MAX_SEEDS, steps: int | None = None,
            log_every: int | None = None,
            device: Device | str | None = None, task_options: dict[str, Any] | None = None,
            lr: float | None = None, run_audit: bool = True, out: str | Path | None = None,
            progress: Progress | None = None, fp32_modules: Any = None, explain: bool = False,
            explain_budget: float | None = None, explain_factor: float = 2.0, graph: bool | None = None,
            tolerance: float | None = None, fp8_recipe: str = "tensorwise", fp8_layers: str = "paying",
            resume: bool = False, weights: str = "fp32") -> CompareResult:
    """Train in FP32 and in ``precision`` from the same seeds, weights and data; return the verdict.

    Args:
        task_factory: a task spec (``"digits"``, ``"FILE.py:factory"``, ``"module:factory"``) or a
            callable ``factory(seed=...) -> ampkit.Task``.
        precision: the AMP precision to judge (``"auto"``: the device's recommended low precision), or a
            resolved :class:`~ampkit.device.policy.Precision` (then its device is used and ``device`` ignored).
        seeds: how many seeds (0..N-1), or the seeds themselves. The verdict sharpens with every seed;
            one seed can fail or be inconclusive, never pass. ``"auto"``: seeds 0, 1, ... until the verdict is
            decided, judged after each from the third on with sequential bounds (:mod:`ampkit.verify.sequential`),
            at most ``max_seeds``; ``effects["sequential"]`` says how many were used and why it stopped.
        steps: optimizer steps per run (default: the task's ``default_steps``).
        log_every: steps per point of the loss curves (default: about 40 points per curve).
        tolerance: the harm you accept, relative to the FP32 value (default 1 %, at least one counting
            error for an accuracy): :mod:`ampkit.verify.judge`.
        fp32_modules: modules the AMP runs keep in FP32 (names, globs, ``"preset:norm"``; see
            :mod:`ampkit.engine.regions`); the cost of each region is measured and reported in ``regions``.
        explain: rank the modules by the error they add and, after a FAIL, try fixes (``explain``).
        explain_budget: seconds the explanation may take; default ``explain_factor`` (2) times the
            comparison's own time.
        fp8_recipe, fp8_layers: with ``precision="fp8"``, torchao's recipe and which layers convert
            (``"paying"``: those the card's FP8 cost model predicts faster, else refused; ``"eligible"``: every
            layer the shape filter allows, to judge FP8's numerics where it does not pay).
        graph: the step captured as one device graph where possible (None, the default; see
            ``TrainConfig.graph``), and short eager runs for ``ratios["speedup_eager"]``; False: eager only.
        weights: how the AMP runs store their weights (``"bf16"``: BF16 with exact FP32 updates;
            ``"bf16-pure"``: BF16 with no master copy; :mod:`ampkit.engine.master`); the FP32 runs keep FP32.
        out: when given, write ``compare.json``, ``report.html`` and the PNG plots there.
        resume: keep the runs of the comparison already in ``out`` (``compare --continue``): its seeds are
            loaded, not trained again, when every setting matches (:mod:`ampkit.verify.prior`), only the
            missing seeds of ``seeds`` run, and the verdict is judged on all of them.
        progress: called with event dicts (``compare_start``, ``run_start``, the trainer's events
            with a ``run`` key, ``run_end``, ``audit``, ``explain``, ``report``); nothing here prints.

    Raises :class:`~ampkit.errors.UsageError` when ``precision`` is (or resolves to) FP32, or ``tolerance``
    is not a positive number.

    Examples:
        >>> result = ampkit.compare("mytask.py:make_task", precision="fp16", explain=True)  # doctest: +SKIP
        >>> result.explain["recommendation"]["flags"]                                      # doctest: +SKIP
        '--fp32-modules norm'
    """
    t0 = time.perf_counter()
    emit = progress or (lambda ev: None)
    _check_numbers(explain_budget, explain_factor, tolerance)
    refuse_existing(out, resume=resume)
    looks = auto_looks(seeds, max_seeds, resume)
    plan, regions, region_names = _plan(task_factory, precision, device, task_options,
                                        seeds if looks is None else looks.last, steps, log_every, lr, graph,
                                        fp32_modules, out)
    plan.fp8_recipe, plan.fp8_layers, plan.weights = fp8_recipe, fp8_layers, weights
    key = settings(task_spec=task_factory, task=plan.first_task, task_options=task_options, amp=plan.amp,
                   steps=plan.steps, log_every=plan.log_every, lr=lr, fp32_modules=regions, graph=graph,
                   fp8_recipe=fp8_recipe, fp8_layers=fp8_layers, torch_version=_versions(plan.amp.device)["torch"])
    if weights != "fp32":  # only then: comparisons saved before --weights existed continue as before
        key["weights"] = weights
    run_notes: list[str] = []
    if weights != "fp32":
        run_notes.append({"bf16": "AMP runs: BF16 weights with 16-bit remainders (exact FP32 updates, --weights bf16)",
                          "bf16-pure": "AMP runs: pure BF16 weights, no master copy (--weights bf16-pure)"}[weights])
    prior = _prior(plan, out, key, explain, run_notes) if resume else {"fp32": {}, "amp": {}}
    todo = replace(plan, seeds=tuple(s for s in plan.seeds if s not in prior["fp32"]), inits=plan.inits,
                   first_task=plan.first_task if plan.seeds[0] not in prior["fp32"] else None)
    emit({"event": "compare_start", "runs": 2 * len(todo.seeds), "task": plan.first_task.name,
          "precision": plan.amp.name, "reason": plan.amp.reason, "device": str(plan.amp.device), "steps": plan.steps,
          "seeds": list(todo.seeds) if looks is None else f"auto ({looks.first} to {looks.last})",
          "fp32_modules": list(regions)})
    if looks is None:
        new = _run_all(todo, regions, emit, run_notes) if todo.seeds else {"fp32": {}, "amp": {}}
    else:
        new, stop = run_auto(todo, looks, run_all=lambda sub, first, total: _run_all(sub, regions, emit, run_notes,
                                                                                    first, total),
                             decide=lambda sub, part: judge_runs(sub, part, tolerance, looks=looks).verdict)
        plan.seeds = tuple(new["fp32"])
    plan.graph = todo.graph  # _run_all turns graphs off when one precision could not be captured
    runs = {side: {s: (prior[side] | new[side])[s] for s in plan.seeds} for side in ("fp32", "amp")}
    verdict = judge_runs(plan, runs, tolerance, looks=looks)
    if looks is not None:
        verdict = stopped(verdict, len(plan.seeds), stop)
    result = _measure(plan, runs, verdict, regions, region_names, run_notes, emit, run_audit, t0)
    result = replace(result, continuation={"schema": SCHEMA, "settings": key, "runs": {
        side: {str(s): run_record(r) for s, r in runs[side].items()} for side in runs}})
    if explain:
        emit({"event": "explain"})
        from ampkit.verify.explain import explain as run_explain

        spec = task_factory if isinstance(task_factory, str) else None
        report = run_explain(plan, verdict, runs, task_spec=spec, task_options=task_options, fp32_modules=regions,
                             budget_s=explain_budget or explain_factor * result.wall_s, progress=emit)
        result = replace(result, explain=report, wall_s=time.perf_counter() - t0)
    if out is not None:
        emit({"event": "report", "out": str(out)})
        result = write_outputs(result, out)
    return result


def _prior(plan: RunPlan, out: str | Path | None, key: dict[str, Any], explain: bool, notes: list[str]
           ) -> dict[str, dict[int, Run]]:
    """The runs ``compare --continue`` keeps from ``out`` (checked against this comparison's settings)."""
    if out is None:
        raise UsageError("--continue adds seeds to the comparison in --out DIR: give --out")
    if explain:
        raise UsageError("--continue and --explain: continue the comparison first, then run --explain on its own")
    prior = load_prior(out, key)
    extra = sorted(set(prior["fp32"]) - set(plan.seeds))
    if extra:
        raise UsageError(f"--continue: {out} already holds seeds {_seeds_text(sorted(prior['fp32']))}; give "
                         f"--seeds {max(prior['fp32']) + 1} or more (it has {len(plan.seeds)})")
    kept = sorted(prior["fp32"])
    if kept:
        notes.append(f"continued: seeds {_seeds_text(kept)} loaded from {Path(out) / 'compare.json'} (same settings), "
                     f"{len(plan.seeds) - len(kept)} trained now")
    return prior


def _seeds_text(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2 \
        else ", ".join(map(str, seeds))


def _plan(task_factory: TaskFactory, precision: Precision | str, device: Device | str | None,
          task_options: dict[str, Any] | None, seeds: int | Sequence[int], steps: int | None, log_every: int | None,
          lr: float | None, graph: bool | None, fp32_modules: Any, out: str | Path | None
          ) -> tuple[RunPlan, tuple[str, ...], tuple[str, ...]]:
    """Everything checked before minutes of training: (the plan, the FP32 region specs, the modules they match)."""
    seed_list = _seed_list(seeds, steps)
    if out is not None:
        prepare_folder(out)
    fp32_prec, amp_prec = _precisions(precision, device)
    regions = _fp32_modules(fp32_modules)
    make = _task_maker(task_factory, task_options, amp_prec.device)
    first_task = make(seed_list[0])
    total_steps = steps or first_task.default_steps
    plan = RunPlan(make=make, seeds=tuple(seed_list), steps=total_steps,
                   log_every=log_every or max(1, total_steps // TARGET_POINTS), lr=lr, fp32=fp32_prec, amp=amp_prec,
                   first_task=first_task, graph=graph)
    return plan, regions, _check_regions(first_task, regions, amp_prec)


def judge_runs(plan: RunPlan, runs: dict[str, dict[int, Run]], tolerance: float | None = None,
               fp32: dict[int, Run] | None = None, looks: Looks | None = None) -> Verdict:
    """The paired verdict (:func:`ampkit.verify.judge.judge`) of a comparison's runs (``fp32`` replaces its FP32
    side: explain's reruns at another learning rate)."""
    first = runs["amp"][plan.seeds[0]] if plan.seeds[0] in runs["amp"] else next(iter(runs["amp"].values()))
    task = plan.first_task
    higher = task.higher_is_better if first.metric != "training loss" else False
    count = task.extra.get("n_test") if task.extra and first.metric == task.metric else None
    fp32_runs = runs["fp32"] if fp32 is None else fp32
    return judge(label=plan.amp.name.upper(), fp32={s: outcome(r) for s, r in fp32_runs.items()},
                 amp={s: outcome(r) for s, r in runs["amp"].items()}, metric=first.metric, higher_is_better=higher,
                 bf16_advice=bf16_advice(plan.amp) if plan.amp.use_scaler else None, tolerance=tolerance,
                 metric_count=count if isinstance(count, int) else None, looks=looks)


def _measure(plan: RunPlan, runs: dict[str, dict[int, Run]], verdict: Verdict, regions: tuple[str, ...],
             region_names: tuple[str, ...], run_notes: list[str], emit: Progress, run_audit: bool, t0: float
             ) -> CompareResult:
    """Speed, memory, the audit and the regions' cost (never the verdict), and the result."""
    label = plan.amp.name.upper()
    throughput, memory, ratios, perf_notes = _perf(runs, plan.amp.device, label)
    perf_notes += _eager_too(plan, runs, ratios, label, emit)
    notes = list(verdict.notes) + run_notes + perf_notes
    audit_summary = None
    if run_audit:
        emit({"event": "audit"})
        audit_summary = _audit(plan, regions, notes)
    region_info = _region_info(plan, regions, region_names, emit) if regions else None
    return _result(plan, plan.first_task, verdict, runs, throughput=throughput, memory=memory, ratios=ratios,
                   notes=notes, audit=audit_summary, fp32_modules=regions, regions=region_info,
                   wall_s=time.perf_counter() - t0)


EAGER_STEPS = 60  # steps of each short eager run that measures the eager speed-up beside the graphed one


def _eager_too(plan: RunPlan, runs: dict[str, dict[int, Run]], ratios: dict[str, Any], label: str,
               emit: Progress) -> list[str]:
    """When the runs replayed the step as a device graph, two short eager runs (FP32 and AMP, first seed) give
    the eager speed-up too, and the note tells the user which path their own loop should take."""
    graphed = {side: all(r.result.step_graph for r in runs[side].values()) for side in runs}
    ratios["step_graph"] = graphed["fp32"] and graphed["amp"]
    if not ratios["step_graph"]:
        return []
    emit({"event": "eager_speed"})
    seed, steps = plan.seeds[0], min(plan.steps, EAGER_STEPS)
    sps = {side: plan.run(seed, prec, steps=steps, evaluate=False, graph=False)[1].result.samples_per_s
           for side, prec in (("fp32", plan.fp32), ("amp", plan.amp))}
    eager = sps["amp"] / sps["fp32"] if sps["amp"] and sps["fp32"] else None
    ratios["speedup_eager"] = eager
    graph_speedup = ratios.get("speedup")
    if eager is None or graph_speedup is None:
        return []
    spread = describe(ratios.get("speedup_spread"), graph_speedup)
    return [f"speed-up {spread} with the whole step captured as one device graph in both precisions "
            f"({eager:.2f}x with eager steps, one seed: no spread measured): in your own loop use amp.graph_step(model, optimizer, loss_fn, batch) "
            f"with ampkit.MixedPrecision(\"{plan.amp.name}\", graph=True) and a fused, capturable optimizer"
            + ("" if graph_speedup >= eager else "; here eager steps are as fast: keep amp.step")]


def _check_numbers(explain_budget: float | None, explain_factor: float, tolerance: float | None) -> None:
    for name, value in (("--explain-budget", explain_budget), ("explain_factor", explain_factor),
                        ("--tolerance", tolerance)):
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise UsageError(f"{name} must be a positive number, got {value!r}")


def _region_info(plan: RunPlan, regions: tuple[str, ...], names: tuple[str, ...], emit: Progress) -> dict[str, Any]:
    from ampkit.verify.cost import region_costs

    emit({"event": "regions"})
    return {"specs": list(regions), "names": list(names), **region_costs(plan.make(plan.seeds[0]), plan.amp, regions)}


def _check_regions(task: Task, regions: tuple[str, ...], prec: Precision) -> tuple[str, ...]:
    """The module names the specs match, or the one-line UsageError of a spec that matches nothing (before training)."""
    if not regions:
        return ()
    from ampkit.engine.regions import apply_fp32_regions

    handle = apply_fp32_regions(task.model, list(regions), device_type=prec.device.type)
    handle.remove()
    return tuple(handle.names)


def _result(plan: RunPlan, task: Task, verdict: Verdict, runs: dict[str, dict[int, Run]], **extra: Any
            ) -> CompareResult:
    dev = plan.amp.device
    scale_trace = None
    if plan.amp.use_scaler:
        scale_trace = {s: [[int(h["step"]), float(h["scale"])] for h in r.result.history]
                       for s, r in runs["amp"].items()}
    return CompareResult(
        verdict=verdict.verdict, reasons=verdict.reasons, warnings=verdict.warnings, notes=tuple(extra.pop("notes")),
        task=task.name, task_description=task.description, precision=plan.amp.name,
        precision_reason=plan.amp.reason, seeds=plan.seeds, steps=plan.steps, log_every=plan.log_every,
        device={"type": dev.type, "name": dev.name, "str": str(dev)}, versions=_versions(dev),
        curves={side: {s: outcome(r).curve for s, r in runs[side].items()} for side in runs},
        band=verdict.band, final_metric=verdict.final_metric, skipped={**verdict.skipped, "steps": plan.steps},
        scale_trace=scale_trace, margins={**MARGINS, **SETTINGS}, effects=verdict.effects, **extra)


def write_outputs(result: CompareResult, out: str | Path) -> CompareResult:
    """Write ``compare.json``, ``report.html`` and the PNGs into ``out``; return the result with their paths."""
    import json

    from ampkit.verify.report import write_report

    folder = prepare_folder(out)
    try:
        html, pngs = write_report(result, folder)
        result = replace(result, report=str(html), files=tuple(str(p) for p in [folder / "compare.json", html, *pngs]))
        (folder / "compare.json").write_text(json.dumps(result.to_dict(), indent=2, default=str, allow_nan=False)
                                             + "\n", encoding="utf-8")
    except OSError as exc:  # a full disk after minutes of training: the verdict is kept, in one line
        raise AmpkitError(f"cannot write the report into {folder}: {exc.strerror or exc}; the verdict was "
                          f"{result.verdict}, {_keep(result)}") from None
    return result


def _keep(result: CompareResult) -> str:
    import json
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix="ampkit-compare-", suffix=".json")
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    except OSError:
        return "and compare.json could not be saved elsewhere either"
    return f"compare.json is saved in {path}"
