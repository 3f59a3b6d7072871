"""``ampkit compare --explain``: where the AMP run goes wrong, and the smallest change that fixes it.

>>> result = ampkit.compare("mytask.py:make_task", precision="fp16", explain=True)     # doctest: +SKIP
>>> result.explain["recommendation"]["flags"]                                          # doctest: +SKIP
'--fp32-modules norm'

1. **Where.** The seed whose AMP curve leaves FP32 first (:attr:`Verdict.exits`) is followed to that step (the FP32
   run is retrained to it from the same seed: same weights, same batches) and, at the start and at
   that step, one batch is run in FP32 and in the AMP precision: :func:`ampkit.verify.locate.module_errors`
   ranks the modules by the error they add and names overflow / underflow / absorbed inf inside them.
   When only the final metric failed, the step is the last one.
2. **What fixes it** (only after a FAIL). Candidates are tried with reruns of the AMP side from the
   same seeds, initial weights and data, judged against the comparison's own FP32 runs by the same
   paired judge (:mod:`ampkit.verify.judge`, with the comparison's tolerance); a rerun stops at its first
   non-finite loss, skipped share or scale collapse. Only a FAIL is searched: an inconclusive verdict
   needs more seeds, not a fix.
   In order, stopping at the first that passes: the top-ranked module kept in FP32
   (``fp32_modules``), then every module that stands out, bisected down to the fewest that pass; the
   other low precision where the card has it (FP16 with loss scaling for BF16, and the reverse);
   half the learning rate (FP32 is rerun too: the reference moves with it). Each tried candidate records
   its verdict and its measured speed and peak memory.
3. **Bounded.** Nothing starts that the remaining budget (default: twice the comparison's time)
   cannot pay for, estimated from the comparison's own run times; a candidate that runs out of time
   is reported as unfinished.
"""

from __future__ import annotations

import math
import shlex
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ampkit.device.policy import Precision, resolve_precision, supports
from ampkit.verify.band import RunOutcome, seed_reasons
from ampkit.verify.judge import Verdict, judge
from ampkit.verify.locate import module_errors
from ampkit.verify.runs import Abort, Run, RunPlan, median, outcome

__all__ = ["explain", "MAX_REGIONS", "STANDOUT", "LR_FACTOR"]

MAX_REGIONS = 8  # modules that stand out, at most, in the fp32_modules candidates
STANDOUT = 3.0  # stands out: STANDOUT x the median error of the modules that add any, or an overflow/underflow
LR_FACTOR = 0.5
TOP = 20  # ranking entries kept in compare.json

Progress = Callable[[dict[str, Any]], None]


@dataclass
class _Ctx:
    plan: RunPlan
    verdict: Verdict
    runs: dict[str, dict[int, Run]]
    metric: str
    higher: bool
    regions: tuple[str, ...]
    deadline: float
    emit: Progress
    task_spec: str | None
    task_options: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    @property
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def cost(self, side: str, share: float = 1.0) -> float:
        """Seconds that rerunning every seed of ``side`` for ``share`` of the steps is expected to take."""
        return share * sum(r.wall_s for r in self.runs[side].values())

    def affordable(self, what: str, seconds: float) -> bool:
        if seconds <= self.left:
            return True
        self.notes.append(f"{what}: not tried, it needs about {_secs(seconds)} and {_secs(max(self.left, 0))} of "
                          "the explain budget are left (raise --explain-budget)")
        return False


def _secs(x: float) -> str:
    return "under 0.1 s" if x < 0.1 else f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


# ---------------------------------------------------------------------------------------- where
def _focus(verdict: Verdict, plan: RunPlan) -> tuple[int, int | None]:
    """(seed, step): the seed that leaves FP32 first and that step; the last step when only the end failed."""
    exits = {s: k for s, k in verdict.exits.items() if k is not None}
    if exits:
        seed = min(exits, key=lambda s: (exits[s], s))
        return seed, exits[seed]
    return plan.seeds[0], (plan.steps if verdict.verdict == "fail" else None)


def _scale_at(run: Run, step: int, precision: Precision) -> float:
    if not precision.use_scaler:
        return 1.0
    scales = [h["scale"] for h in run.result.history if h["step"] <= step and h.get("scale")]
    return float(scales[-1]) if scales else 2.0**16


def _rank_at(ctx: _Ctx, seed: int, step: int) -> list[dict[str, Any]]:
    from ampkit.training.trainer import batch_to

    plan = ctx.plan
    ctx.emit({"event": "explain_step", "what": f"ranking modules at step {step} (seed {seed})"})
    if step == 0:
        task = plan.task(seed)
    else:  # the FP32 weights at that step: retrain FP32 from the same seed (same weights, same batches)
        task, _ = plan.run(seed, plan.fp32, steps=step, evaluate=False)
    model = task.model.to(plan.amp.device.torch_device)
    batch = batch_to(task.batch(step), plan.amp.device)
    handle = None
    if ctx.regions:  # the AMP side as it ran: declared regions kept in FP32
        from ampkit.engine.regions import apply_fp32_regions

        handle = apply_fp32_regions(model, list(ctx.regions), device_type=plan.amp.device.type)
    try:
        errors = module_errors(model, lambda: task.loss(model, batch), plan.amp, seed=seed * 7919 + step,
                               scale=_scale_at(ctx.runs["amp"][seed], step, plan.amp))
    finally:
        if handle is not None:
            handle.remove()
    return [{**e.to_dict(), "step": step} for e in errors]


def _merge(rankings: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per module: the step where it added the most error, with the other steps' figures."""
    best: dict[str, dict[str, Any]] = {}
    for step, entries in rankings.items():
        for e in entries:
            cur = best.get(e["module"])
            by_step = dict(cur["added_by_step"]) if cur else {}
            by_step[str(step)] = e["added"]
            if cur is None or _key(e) > _key(cur):
                cur = {**e, "events": list(e["events"])}
            elif e["events"]:
                cur["events"] = list(dict.fromkeys(cur["events"] + e["events"]))
            cur["added_by_step"] = by_step
            best[e["module"]] = cur
    roots = [e for e in best.values() if e["module"].startswith("(")]
    rest = sorted((e for e in best.values() if not e["module"].startswith("(")), key=lambda e: -_key(e))
    return rest + roots


def _key(e: dict[str, Any]) -> float:
    v = e.get("added")
    return math.inf if v is None else float(v)


def _standouts(ranking: list[dict[str, Any]], declared: tuple[str, ...]) -> list[str]:
    """Module names worth keeping in FP32: an overflow/underflow, or STANDOUT x the median added error."""
    mods = [e for e in ranking if not e["module"].startswith("(")]
    if not mods:
        return []
    # the median over modules that add any error: norms and embeddings that stay exact would drag it to 0
    adding = [_key(e) for e in mods if 0 < _key(e) < math.inf]
    med = statistics.median(adding) if adding else 0.0
    out: list[str] = []
    for e in mods:
        name = e["module"]
        flagged = any(ev.startswith(("overflow", "underflow")) for ev in e["events"])
        if not (flagged or (_key(e) > 0 and _key(e) >= STANDOUT * med)):
            continue
        if any(name == d or name.startswith(d + ".") for d in declared + tuple(out)):
            continue  # already inside a region
        out.append(name)
    return out[:MAX_REGIONS]


# ---------------------------------------------------------------------------------------- what fixes it
def _watchdog(label: str, seed: int, emit: Progress) -> Progress:
    """Stops a rerun at its first non-finite loss window or scale collapse: it has failed already."""

    def watch(ev: dict[str, Any]) -> None:
        if ev.get("event") == "log" and ev.get("loss") is None:
            raise Abort(f"{label} loss became non-finite at step {ev['step']} (seed {seed})")
        if ev.get("event") == "warning" and ev.get("code") == "scale-collapse":
            raise Abort(f"scale collapsed (seed {seed}): {ev.get('message')}")

    return watch


def _rerun(ctx: _Ctx, precision: Precision, regions: tuple[str, ...], lr: float | None
           ) -> tuple[dict[int, Run], list[str], str | None]:
    """AMP reruns seed by seed; (runs, early failure reasons, why it stopped unfinished or None)."""
    label = precision.name.upper()
    done: dict[int, Run] = {}
    for seed in ctx.plan.seeds:
        if ctx.left <= 0:
            return done, [], "the explain budget ran out"
        try:
            _, run = ctx.plan.run(seed, precision, fp32_modules=regions, lr=lr,
                                  progress=_watchdog(label, seed, ctx.emit))
        except Abort as exc:
            return done, [str(exc)], None
        done[seed] = run
        early = seed_reasons(seed, outcome(run), label)
        if early:
            return done, early, None
    return done, [], None


def _fp32_side(ctx: _Ctx, lr: float | None) -> dict[int, RunOutcome] | None:
    """The FP32 outcomes to judge against: the comparison's own, or reruns at another learning rate."""
    if lr is None:
        return {s: outcome(r) for s, r in ctx.runs["fp32"].items()}
    out = {}
    for seed in ctx.plan.seeds:
        if ctx.left <= 0:
            return None
        out[seed] = outcome(ctx.plan.run(seed, ctx.plan.fp32, lr=lr)[1])
    return out


def _try(ctx: _Ctx, kind: str, change: str, *, precision: Precision, regions: tuple[str, ...] = (),
         lr: float | None = None) -> dict[str, Any]:
    """Rerun with one change and judge it like the comparison; speed and memory measured in the reruns."""
    t0 = time.perf_counter()
    entry: dict[str, Any] = {"kind": kind, "change": change, "precision": precision.name,
                             "fp32_modules": list(regions), "lr": lr}
    need = ctx.cost("amp") + (ctx.cost("fp32") if lr is not None else 0.0)
    if not ctx.affordable(change, need):
        return {**entry, "verdict": "not tried", "reasons": ["over the explain budget"], "wall_s": 0.0}
    ctx.emit({"event": "explain_step", "what": f"trying: {change}"})
    fp32 = _fp32_side(ctx, lr)
    unfinished = "the explain budget ran out" if fp32 is None else None
    runs, reasons = {}, []
    if fp32 is not None:
        runs, reasons, unfinished = _rerun(ctx, precision, regions, lr)
    if unfinished:
        verdict = "unfinished"
    elif reasons:
        verdict = "fail"
    else:
        v = judge(label=precision.name.upper(), fp32=fp32, amp={s: outcome(r) for s, r in runs.items()},
                  metric=ctx.metric, higher_is_better=ctx.higher, tolerance=ctx.verdict.tolerance,
                  metric_count=ctx.verdict.metric_count)
        verdict, reasons = v.verdict, list(v.reasons)
    entry.update(verdict=verdict, reasons=reasons, unfinished=unfinished, seeds_run=sorted(runs),
                 wall_s=time.perf_counter() - t0, **_cost(ctx, runs))
    ctx.emit({"event": "explain_step", "what": f"{change}: {verdict.upper()}"})
    return entry


def _cost(ctx: _Ctx, runs: dict[int, Run]) -> dict[str, Any]:
    sps = median([r.result.samples_per_s for r in runs.values()])
    peaks = [r.result.peak_mem_bytes for r in runs.values()]
    peak = max(peaks) if peaks and all(p is not None for p in peaks) else None
    amp_sps = median([r.result.samples_per_s for r in ctx.runs["amp"].values()])
    fp32_sps = median([r.result.samples_per_s for r in ctx.runs["fp32"].values()])
    amp_peak = max((r.result.peak_mem_bytes or 0) for r in ctx.runs["amp"].values()) or None
    return {"samples_per_s": sps, "peak_mem_bytes": peak,
            "speed_vs_amp": sps / amp_sps if sps and amp_sps else None,
            "speed_vs_fp32": sps / fp32_sps if sps and fp32_sps else None,
            "memory_vs_amp": peak / amp_peak if peak and amp_peak else None}


def _other_precision(plan: RunPlan) -> Precision | None:
    """FP16 with loss scaling for BF16, and the reverse, where the card has it (policy decides)."""
    other = "fp16" if plan.amp.name == "bf16" else "bf16"
    return resolve_precision(other, plan.amp.device) if supports(other, plan.amp.device) else None


def _regions_search(ctx: _Ctx, names: list[str]) -> list[dict[str, Any]]:
    """Top-1 first; then all that stand out; then bisect down to the fewest of the ranking that pass."""
    tried: list[dict[str, Any]] = []

    def attempt(k: int) -> bool:
        subset = tuple(names[:k])
        what = ", ".join(f"`{n}`" for n in subset)
        tried.append(_try(ctx, "fp32_modules", f"keep {what} in FP32", precision=ctx.plan.amp,
                          regions=ctx.regions + subset))
        return tried[-1]["verdict"] == "pass"

    if not names or attempt(1) or len(names) == 1 or not attempt(len(names)):
        return tried
    lo, hi = 1, len(names)  # lo fails, hi passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(mid):
            hi = mid
        else:
            lo = mid
    return tried


def _search(ctx: _Ctx, ranking: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tried = _regions_search(ctx, _standouts(ranking, ctx.regions))
    if any(c["verdict"] == "pass" for c in tried):
        return tried
    other = _other_precision(ctx.plan)
    if other is not None:
        how = "FP16 with loss scaling" if other.name == "fp16" else "BF16 (no loss scaling)"
        tried.append(_try(ctx, "precision", f"{how} instead of {ctx.plan.amp.name.upper()}", precision=other,
                          regions=ctx.regions))
        if tried[-1]["verdict"] == "pass":
            return tried
    else:
        ctx.notes.append(f"the other low precision is not available on {ctx.plan.amp.device}: not tried")
    lr = LR_FACTOR * _base_lr(ctx.plan)
    tried.append(_try(ctx, "lr", f"learning rate {lr:g} ({LR_FACTOR:g}x)", precision=ctx.plan.amp,
                      regions=ctx.regions, lr=lr))
    return tried


def _base_lr(plan: RunPlan) -> float:
    if plan.lr is not None:
        return plan.lr
    task = plan.first_task if plan.first_task is not None else plan.make(plan.seeds[0])
    return task.lr


# ---------------------------------------------------------------------------------------- say it
def _task_args(ctx: _Ctx) -> list[str]:
    if ctx.task_spec is None:
        return []
    out = ["--task", ctx.task_spec]
    for k, v in (ctx.task_options or {}).items():
        out += ["--task-arg", f"{k}={v}"]
    return out


def _flags(ctx: _Ctx, c: dict[str, Any]) -> list[str]:
    out = []
    if c["fp32_modules"]:
        out += ["--fp32-modules", ",".join(c["fp32_modules"])]
    if c["precision"] != ctx.plan.amp.name:
        out += ["--precision", c["precision"]]
    if c["lr"] is not None:
        out += ["--lr", f"{c['lr']:g}"]
    return out


def _python(c: dict[str, Any]) -> str:
    args = [repr(c["precision"])]
    if c["fp32_modules"]:
        args.append(f"fp32_modules={c['fp32_modules']!r}")
    text = f"ampkit.MixedPrecision({', '.join(args)})"
    if c["fp32_modules"]:
        text += " and amp.attach(model)"
    if c["lr"] is not None:
        text += f"; the optimizer's lr={c['lr']:g} (TrainConfig(lr={c['lr']:g}))"
    return text


def _recommend(ctx: _Ctx, candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest passing change: the fewest FP32 modules, then the other precision, then the learning rate."""
    order = {"fp32_modules": 0, "precision": 1, "lr": 2}
    passing = [c for c in candidates if c["verdict"] == "pass"]
    if not passing:
        return None
    c = min(passing, key=lambda c: (order[c["kind"]], len(c["fp32_modules"])))
    plan = ctx.plan
    flags = _flags(ctx, c)
    seeds = ["--seeds", str(len(plan.seeds))] if plan.seeds == tuple(range(len(plan.seeds))) else []
    lr = ["--lr", f"{plan.lr:g}"] if plan.lr is not None and c["lr"] is None else []
    base = _task_args(ctx) + ["--precision", c["precision"]]
    rest = [f for i, f in enumerate(flags) if "--precision" not in flags[max(i - 1, 0):i + 1]]
    compare_cmd = ["ampkit", "compare", *base, *seeds, "--steps", str(plan.steps), *lr, *rest]
    train_cmd = ["ampkit", "train", *base, *lr, *rest]
    compare_kw = [f"precision={c['precision']!r}"] + ([f"fp32_modules={c['fp32_modules']!r}"] if c["fp32_modules"]
                                                       else []) + ([f"lr={c['lr']:g}"] if c["lr"] is not None else [])
    return {"kind": c["kind"], "change": c["change"], "flags": shlex.join(flags),
            "fp32_modules": c["fp32_modules"], "precision": c["precision"], "lr": c["lr"],
            "compare_command": shlex.join(compare_cmd), "train_command": shlex.join(train_cmd),
            "python": _python(c), "python_compare": f"ampkit.compare(..., {', '.join(compare_kw)})",
            "speed_vs_amp": c.get("speed_vs_amp"), "speed_vs_fp32": c.get("speed_vs_fp32"),
            "memory_vs_amp": c.get("memory_vs_amp"),
            "command_note": None if ctx.task_spec else "add your --task (the task was given as a Python factory)"}


def _pct(v: Any) -> str:
    return "inf/NaN" if v is None else f"{v:.2%}" if v < 0.1 else f"{v:.0%}"


def _summary(ctx: _Ctx, seed: int, step: int | None, ranking: list[dict[str, Any]], candidates: list[dict[str, Any]],
             rec: dict[str, Any] | None) -> list[str]:
    label = ctx.plan.amp.name.upper()
    out = []
    if step is not None and ctx.verdict.exits.get(seed) is not None:
        out.append(f"where: {label} leaves FP32 for good at step {step} (seed {seed}); modules ranked at step 0 "
                   f"and step {step}")
    elif step is not None:
        out.append(f"where: the loss curves stay within the tolerance, the final metric does not; modules ranked at step 0 and at "
                   f"the last step ({step}, seed {seed})")
    top = [e for e in ranking if not e["module"].startswith("(")][:3]
    if top:
        worst = top[0]
        events = f" ({worst['events'][0]})" if worst["events"] else ""
        out.append(f"most error added: `{worst['module']}` ({worst['type']}): {_pct(worst['added'])} relative to "
                   f"FP32{events}" + ("; then " + ", ".join(f"`{e['module']}` {_pct(e['added'])}" for e in top[1:])
                                      if len(top) > 1 else ""))
    for c in candidates:
        cost = f", speed {c['speed_vs_amp']:.2f}x of {label}" if c.get("speed_vs_amp") else ""
        out.append(f"tried: {c['change']}: {c['verdict'].upper()}{cost}"
                   + (f" ({c['reasons'][0]})" if c["verdict"] != "pass" and c.get("reasons") else ""))
    if rec is not None:
        out.append(f"fix: {rec['change']}: {rec['flags']} (PASS in the reruns); python: {rec['python']}")
    elif ctx.verdict.verdict == "inconclusive":
        out.append("inconclusive: no fix is searched for a harm that is not shown; run more --seeds (the reasons say "
                   "about how many)")
    elif not ctx.verdict.passed:
        out.append("no candidate brought the run back within the tolerance of FP32" + (
            " within the budget" if any(c["verdict"] in ("unfinished", "not tried") for c in candidates) else ""))
    return out


def explain(plan: RunPlan, verdict: Verdict, runs: dict[str, dict[int, Run]], *, task_spec: str | None = None,
            task_options: dict[str, Any] | None = None, fp32_modules: tuple[str, ...] = (), budget_s: float,
            progress: Progress | None = None) -> dict[str, Any]:
    """The ``explain`` section of ``compare.json`` (see the module docstring); nothing printed."""
    t0 = time.perf_counter()
    first = runs["amp"][plan.seeds[0]]
    higher = plan.first_task.higher_is_better if plan.first_task is not None and first.metric != "training loss" \
        else False
    ctx = _Ctx(plan=plan, verdict=verdict, runs=runs, metric=first.metric, higher=higher, regions=tuple(fp32_modules),
               deadline=t0 + budget_s, emit=progress or (lambda ev: None), task_spec=task_spec,
               task_options=task_options)
    seed, step = _focus(verdict, plan)
    rankings = {}
    # A ranking runs each module alone about 4 times: priced at 4 training steps per module until measured.
    n_modules = sum(1 for _ in (plan.first_task or plan.make(seed)).model.modules())
    rank_s = ctx.cost("amp") / (len(plan.seeds) * plan.steps) * (4 + 4 * n_modules)
    for at in [0] + ([step] if step else []):
        if ctx.affordable(f"ranking at step {at}", ctx.cost("fp32", at / plan.steps) / len(plan.seeds) + rank_s):
            t_rank = time.perf_counter()
            rankings[at] = _rank_at(ctx, seed, at)
            rank_s = time.perf_counter() - t_rank
    ranking = _merge(rankings)
    reference_bad = any(r.startswith("the FP32 reference itself") for r in verdict.reasons)
    if reference_bad:
        ctx.notes.append("the FP32 reference itself failed: fix the task (learning rate, data) first; "
                         "no precision change can be judged against it")
    candidates = [] if verdict.verdict != "fail" or reference_bad else _search(ctx, ranking)
    rec = _recommend(ctx, candidates)
    return {"trigger": "requested" if verdict.verdict != "fail" else "fail", "seed": seed, "steps_ranked": sorted(rankings),
            "exit_step": verdict.exits.get(seed), "ranking": ranking[:TOP], "candidates": candidates,
            "recommendation": rec, "summary": _summary(ctx, seed, step, ranking, candidates, rec),
            "notes": ctx.notes, "budget_s": budget_s, "wall_s": time.perf_counter() - t0}
