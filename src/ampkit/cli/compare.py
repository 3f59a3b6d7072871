"""``ampkit compare``: FP32 against AMP on the same seeds, weights and data; a verdict and a report."""

from __future__ import annotations

import argparse
import math
import sys

from ampkit.cli.common import (ProgressView, add_device_arg, add_fp8_recipe_arg, add_fp32_modules_arg, add_precision_arg,
                               add_weights_arg,
                               console, print_json)
from ampkit.cli.train import add_task_args

EXAMPLES = """examples:
  ampkit compare                                   # digits, the device's low precision, seeds until decided
  ampkit compare --precision fp16 --seeds 5        # judge FP16 against five FP32 seeds
  ampkit compare --task-arg size=small            # digits' CPU-sized model, also on a GPU
  ampkit compare --task mytask.py:make_task --steps 500 --out runs/mine
  ampkit compare --json > verdict.json             # the same as DIR/compare.json, on stdout
  ampkit compare --task mytask.py:make_task --precision fp16 --explain
                                                   # on FAIL: which module adds the error, and the fix
  ampkit compare --precision fp16 --fp32-modules norm,preset:loss   # with FP32 regions, and their cost
  ampkit compare --steps 200 train.py --epochs 1   # YOUR script, unmodified: FP32 by switching
  ampkit compare --metric 'test accuracy ([0-9.]+)' train.py        # also judge a number the script prints
  ampkit compare --seeds 5 --tolerance 0.02      # accept up to 2 % worse than FP32, judged over 5 seeds
  ampkit compare --seeds 8 --out runs/compare --continue   # INCONCLUSIVE at 3 seeds: train seeds 3-7 only
  ampkit compare --max-seeds 16                   # add seeds until the verdict is decided, at most 16
  ampkit compare --nproc 2 train_ddp.py                     # every run: torchrun with 2 processes
  ampkit compare -- torchrun --nproc-per-node 2 train_ddp.py --epochs 1   # the launch you use, unchanged
  ampkit compare -- accelerate launch --num_processes 2 train.py          # Accelerate's launcher

With SCRIPT, each run is `python SCRIPT ARGS` in a fresh process: FP32 runs with every autocast and GradScaler
switched off, AMP runs as written (or --precision bf16/fp16 forcing autocast's dtype); ampkit's seeds replace
the script's own; the loss of each optimizer step is judged. Options go before SCRIPT; what follows is ARGS.

exit status: 0 pass, 1 fail, 2 bad input (or a script that cannot be compared), 3 inconclusive (more seeds
would decide). How the verdict is reached: docs/commands/compare.md, "The verdict".
"""


def register(sub, formatter_class):
    p = sub.add_parser("compare", help="FP32 vs AMP from the same seeds: verdict, curves, speed-up, report",
                       description="Train the task in FP32 over N seeds and in the AMP precision from the same seeds, "
                                   "initial weights and data order. The verdict is a paired test over the seeds: pass "
                                   "when AMP is surely within --tolerance of FP32 (final metric and late loss), fail "
                                   "when surely beyond it (or non-finite, over 5% of steps skipped, FP16 scale "
                                   "collapse), else inconclusive. Also measures samples/s and peak memory of both. "
                                   "Writes DIR/compare.json and DIR/report.html.",
                       epilog=EXAMPLES, formatter_class=formatter_class)
    add_task_args(p)
    add_precision_arg(p)
    add_device_arg(p)
    p.add_argument("--seeds", type=_seeds_arg, default="auto", metavar="N|auto",
                   help="auto (the default): seeds 0, 1, ... are added until the verdict is decided, judged after "
                        "each from the third on with sequential bounds that keep the 5%% error rates (at most "
                        "--max-seeds); N: exactly seeds 0..N-1 (one seed can fail or be inconclusive, never pass)")
    p.add_argument("--max-seeds", type=int, default=None, metavar="M",
                   help="with --seeds auto: stop adding seeds after M, undecided (default 12)")
    p.add_argument("--tolerance", type=float, default=None, metavar="T",
                   help="the harm you accept, relative to FP32 (default 0.01 = 1%%; for an accuracy at least one "
                        "test example)")
    p.add_argument("--steps", type=int, default=None, metavar="S", help="optimizer steps per run (default: the task's)")
    p.add_argument("--log-every", type=int, default=None, metavar="L",
                   help="steps per point of the loss curves (default: about 40 points)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="compare.json, report.html and PNGs go here; a folder that already holds a comparison is "
                        "refused (default: runs/compare, or runs/compare-2, -3, ... when it holds one; with "
                        "--continue the newest)")
    p.add_argument("--continue", dest="resume", action="store_true",
                   help="add seeds to the comparison already in --out: its runs are kept when every setting is the "
                        "same (else refused), only the missing seeds of --seeds N train, and all are judged")
    p.add_argument("--no-audit", action="store_true", help="skip the per-op dtype audit in the report")
    p.add_argument("--json", action="store_true", help="print compare.json on stdout instead of a summary")
    p.add_argument("--no-graph", action="store_true",
                   help="eager steps only (by default, on a device with graphs, both precisions replay the whole "
                        "step as one device graph and short eager runs give the eager speed-up too)")
    add_fp32_modules_arg(p)
    add_weights_arg(p)
    add_fp8_recipe_arg(p, "with --precision fp8")
    p.add_argument("--explain", action="store_true",
                   help="rank the modules by the error they add (at the start and where the AMP curve leaves the "
                        "band) and, on FAIL, try fixes with reruns: FP32 modules, the other precision, a lower lr")
    p.add_argument("--explain-budget", default=None, metavar="SECONDS|FACTORx",
                   help="time limit of --explain: seconds (300) or a factor of the comparison's time (1.5x); "
                        "default 2x")
    p.add_argument("--metric", default=None, metavar="REGEX",
                   help="with SCRIPT: a final metric the script prints, its first group a number (last match), "
                        "e.g. 'test accuracy ([0-9.]+)'")
    p.add_argument("--metric-mode", default=None, choices=("max", "min"),
                   help="with --metric: higher (max) or lower (min) is better (default: max when REGEX names an "
                        "accuracy-like quantity: acc, f1, auc, bleu, rouge, score, precision, recall, map, iou)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="with SCRIPT: launch every run with torchrun, N processes on this machine (or give the "
                        "launch itself: ampkit compare -- torchrun --nproc-per-node N SCRIPT ARGS)")
    p.add_argument("script", nargs="?", default=None, metavar="SCRIPT",
                   help="your training script, run unmodified (instead of --task)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT")
    p.set_defaults(func=run)
    return p


_TASK_ONLY = (("task", "digits"), ("task_arg", []), ("lr", None), ("fp32_modules", None), ("explain", False),
              ("explain_budget", None), ("no_graph", False), ("device", None), ("fp8_recipe", "tensorwise"),
              ("fp8_layers", "paying"), ("resume", False), ("weights", "fp32"))


def _seeds_arg(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of seeds or 'auto', got {text!r}") from None


def _max_seeds(args) -> int:
    from ampkit.errors import UsageError
    from ampkit.verify.sequential import MAX_SEEDS

    if args.max_seeds is not None and args.seeds != "auto":
        raise UsageError("--max-seeds bounds --seeds auto: add --seeds auto, or drop --max-seeds")
    return MAX_SEEDS if args.max_seeds is None else args.max_seeds


def _run_script(args) -> int:
    from ampkit.errors import UsageError
    from ampkit.verify.script_compare import compare_script

    if args.script.startswith("-"):
        raise UsageError(f"unknown option {args.script!r} (options go before SCRIPT; see ampkit compare --help)")
    for name, default in _TASK_ONLY:
        if getattr(args, name, default) != default:
            flag = "continue" if name == "resume" else name.replace("_", "-")
            raise UsageError(f"--{flag} is for tasks, not for a SCRIPT (the script decides its "
                             f"model, device and learning rate): drop it")
    if args.metric_mode is not None and args.metric is None:
        raise UsageError("--metric-mode says which direction of --metric is better: add --metric REGEX")
    from ampkit.diagnose.script_launch import Launch, is_launcher, parse_launch

    launch = None
    if is_launcher(args.script, args.script_args):
        if args.nproc is not None:
            raise UsageError("--nproc and a launcher command both say how to launch: give one of them")
        launch, args.script, args.script_args = parse_launch([args.script, *args.script_args])
    elif args.nproc is not None:
        launch = Launch.torchrun(args.nproc)
    import signal

    from ampkit.verify.interrupt import stop_on_signals

    # A stop signal becomes Interrupted: the running script's process group is stopped, nothing is judged.
    with stop_on_signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP)), \
            _Progress(enabled=not args.json and sys.stderr.isatty(), quiet=args.json) as bar:
        result = compare_script(args.script, args.script_args, precision=args.precision, seeds=args.seeds,
                                max_seeds=_max_seeds(args),
                                steps=args.steps, log_every=args.log_every, metric=args.metric,
                                metric_mode=args.metric_mode, out=args.out, run_audit=not args.no_audit, progress=bar,
                                tolerance=args.tolerance, launch=launch)
    if args.json:
        print_json(result.to_dict())
    else:
        _summary(result)
    return {"pass": 0, "fail": 1, "inconclusive": 3}[result.verdict]


def _budget(text: str | None) -> tuple[float | None, float]:
    """``"300"`` -> (300 s, default factor); ``"1.5x"`` -> (None, 1.5)."""
    from ampkit.errors import UsageError

    if text is None:
        return None, 2.0
    raw = text.strip().lower()
    try:
        value = float(raw[:-1] if raw.endswith("x") else raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"--explain-budget takes seconds (300) or a factor of the comparison's time (1.5x), "
                         f"got {text!r}")
    return (None, value) if raw.endswith("x") else (value, 2.0)


def run(args) -> int:
    from ampkit.errors import UsageError
    from ampkit.tasks import parse_task_args
    from ampkit.verify.compare import compare

    if args.tolerance is not None and not 0 < args.tolerance < float("inf"):
        raise UsageError(f"--tolerance must be a positive fraction, e.g. 0.01 for 1 %, got {args.tolerance}")
    if isinstance(args.seeds, int) and args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.log_every is not None and args.log_every < 1:
        raise UsageError(f"--log-every must be >= 1, got {args.log_every}")
    if args.out is None:
        from ampkit.verify.prior import default_out

        args.out = str(default_out(resume=args.resume and args.script is None))
    if args.script is not None:
        return _run_script(args)
    if args.nproc is not None:
        raise UsageError("--nproc launches a SCRIPT under torchrun; for a task, use ampkit train --nproc N")
    if args.metric is not None or args.metric_mode is not None:
        raise UsageError("--metric reads a number a SCRIPT prints; a task has its own metric: drop --metric")
    budget, factor = _budget(args.explain_budget)
    if args.explain_budget is not None and not args.explain:
        raise UsageError("--explain-budget limits --explain: add --explain")
    from ampkit.verify.interrupt import stop_on_signals

    with stop_on_signals(), _Progress(enabled=not args.json and sys.stderr.isatty(), quiet=args.json) as bar:
        result = compare(args.task, precision=args.precision, seeds=args.seeds, max_seeds=_max_seeds(args),
                         steps=args.steps,
                         log_every=args.log_every, device=args.device, task_options=parse_task_args(args.task_arg),
                         lr=args.lr, run_audit=not args.no_audit, out=args.out, progress=bar,
                         fp32_modules=args.fp32_modules, explain=args.explain, explain_budget=budget,
                         explain_factor=factor, graph=False if args.no_graph else None, tolerance=args.tolerance,
                         fp8_recipe=args.fp8_recipe, fp8_layers=args.fp8_layers, resume=args.resume,
                         weights=args.weights)
    if args.json:
        print_json(result.to_dict())
    else:
        _summary(result)
    return {"pass": 0, "fail": 1, "inconclusive": 3}[result.verdict]


class _Progress(ProgressView):
    """One rich bar over all 2N runs (steps of every run); plain lines when stderr is not a TTY."""

    def __init__(self, enabled: bool, quiet: bool) -> None:
        super().__init__(enabled, counter="elapsed")
        self.quiet = quiet
        self.bar = None
        self.steps = 0
        self.desc, self.run_steps = "run", 0

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if self.quiet:
            return
        if kind == "compare_start" and ev.get("script"):
            self.steps = ev["steps"] or 1
            self.err.print(f"[bold]{ev['task']}[/]: FP32 (autocast and GradScaler switched off) vs AMP "
                           f"({ev['reason']}), seeds {ev['seeds']}, "
                           + (f"{ev['steps']} steps each" if ev["steps"] else "the script's own length"))
            if self.progress is not None:
                self.bar = self.progress.add_task("compare", total=ev["runs"] * self.steps, info="")
        elif kind == "compare_start":
            self.steps = ev["steps"] or 1
            self.err.print(f"[bold]{ev['task']}[/] on {ev['device']}: FP32 vs {ev['precision'].upper()} "
                           f"({ev['reason']}), seeds {ev['seeds']}, {ev['steps']} steps each")
            if self.progress is not None:
                self.bar = self.progress.add_task("compare", total=ev["runs"] * ev["steps"], info="")
        elif kind == "run_start":
            desc = f"run {ev['run']}/{ev['runs']} seed {ev['seed']} {ev['precision']}"
            self.desc, self.run_steps = desc, ev.get("total", self.steps)
            if self.progress is not None:
                # runs can grow: when only one precision could be graphed, the graphed runs are trained again
                self.progress.update(self.bar, description=desc, total=ev["runs"] * self.steps,
                                     completed=(ev["run"] - 1) * self.steps)
        elif kind == "log" and self.progress is None:  # a log file or a pipe: one line per logged step
            loss = "nan" if ev["loss"] is None else f"{ev['loss']:.4f}"
            self.err.print(f"{self.desc}: step {ev['step']}/{self.run_steps} loss {loss}" + (f" scale {ev['scale']:g}" if ev.get("scale", 1) != 1 else ""),
                           highlight=False)
        elif kind == "log":
            loss = "nan" if ev["loss"] is None else f"{ev['loss']:.4f}"
            self.progress.update(self.bar, completed=(ev["run"] - 1) * self.steps + ev["step"],
                                 info=f"loss {loss}" + (f" scale {ev['scale']:g}" if ev.get("scale", 1) != 1 else ""))
        elif kind == "run_end":
            if self.progress is not None:
                self.progress.update(self.bar, completed=ev["run"] * self.steps)
            else:
                value = "n/a" if ev["value"] is None else f"{ev['value']:.4g}"
                self.err.print(f"run {ev['run']}/{ev['runs']} seed {ev['seed']} {ev['precision']}: "
                               f"{ev['metric']} {value}, {ev['wall_s']:.1f}s", highlight=False)
        elif kind == "audit" and self.progress is not None:
            self.progress.update(self.bar, description="audit")
        elif kind == "report" and self.progress is not None:
            self.progress.update(self.bar, description="report")
        elif kind == "explain_step":
            if self.progress is not None:
                self.progress.update(self.bar, description=f"explain: {ev['what']}")
            else:
                self.err.print(f"explain: {ev['what']}", highlight=False)
        elif kind == "fp8_trial":  # the FP8 decision timing the model (the first FP8 run; cached after)
            from ampkit.cli.fp8view import fp8_trial_line

            line = fp8_trial_line(ev)
            if line:
                self.err.print(line, highlight=False, soft_wrap=True)


def next_step(r) -> str:
    """What to do after a PASS: the same precision in the user's own training."""
    prec = r.precision
    return (f"train with {prec.upper()} in your own loop: ampkit.MixedPrecision(\"{prec}\") (docs/api/engine.md), "
            f"or ampkit train --task yours.py:make_task --precision {prec}")


def _num(v, fmt="{:.4g}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _summary(r) -> None:
    from rich.table import Table

    from ampkit.training.speed import fmt_rate

    from ampkit.training.speed import describe
    from ampkit.verify.figures import allowed_text, mean_text, metric_format
    from ampkit.verify.next_step import after_failure

    out = console()
    amp = r.precision.upper()
    m = r.final_metric
    if r.task_description:
        out.print(f"task: {r.task_description}", highlight=False)  # what was measured on what (e.g. the test set)
    t = Table(title=f"{r.task}: FP32 vs {amp} on {r.device['name']} ({r.device['str']}), "
                    f"{len(r.seeds)} seeds x {r.steps} steps", title_justify="left")
    t.add_column("")
    t.add_column("FP32", justify="right")
    t.add_column(amp, justify="right")
    t.add_column("", justify="left")

    def span(vals, fmt="{:.4g}".format):
        finite = [v for v in vals if v is not None and math.isfinite(v)]
        bad = f"{len(vals) - len(finite)} not finite" if len(finite) < len(vals) else ""
        if not finite:
            return bad or "n/a"
        text = f"{fmt(min(finite))}..{fmt(max(finite))}" if len(finite) > 1 else fmt(finite[0])
        return f"{text} (+{bad})" if bad else text

    fmt = metric_format(m)  # the report's card writes the metric, and its bound, by the same rules
    t.add_row(f"final {m['name']} (mean)", mean_text(m, "fp32", fmt), mean_text(m, "amp", fmt), allowed_text(m, fmt))
    t.add_row(f"final {m['name']} (seeds)", span(m.get("fp32", []), fmt), span(m.get("amp", []), fmt), "")
    if m["name"] != "training loss":  # else the row above already is the final training loss, seed by seed
        last = {side: [c[-1][1] if c else None for c in r.curves[side].values()] for side in ("fp32", "amp")}
        t.add_row("final training loss", span(last["fp32"]), span(last["amp"]), "")
    sp = r.ratios.get("speedup")
    t.add_row(f"{r.throughput.get('unit', 'samples/s')} (median)", fmt_rate(r.throughput.get("fp32")),
              fmt_rate(r.throughput.get("amp")),
              f"speed-up {describe(r.ratios.get('speedup_spread'), sp)}" if sp else "")
    mem = r.memory
    saving = r.ratios.get("memory_saving")
    t.add_row("peak memory", _num(mem.get("fp32") and mem["fp32"] / 2**20, "{:,.0f} MiB"),
              _num(mem.get("amp") and mem["amp"] / 2**20, "{:,.0f} MiB"),
              f"saving {saving:.0%}" if saving is not None else f"n/a on {r.device['type'].upper()}")
    skipped = r.skipped["amp"]
    t.add_row("skipped steps", "0" if not any(r.skipped["fp32"].values()) else str(sum(r.skipped["fp32"].values())),
              str(sum(skipped.values())), f"of {r.steps * len(r.seeds)}")
    if r.audit and r.audit.get("matmul_share") is not None:
        t.add_row("matmul FLOPs in low precision", "", f"{r.audit['matmul_share']:.0%}",
                  f"{len(r.audit.get('surprises', []))} audit surprise(s)")
    out.print(t)
    for w in r.warnings:
        out.print(f"[yellow]warning {w.get('code')}[/]: {w.get('message')}" + (f". fix: {w['fix']}" if w.get("fix") else ""))
    for n in r.notes:
        out.print(f"note: {n}", highlight=False)
    _effects(out, r)
    if r.passed:
        out.print(f"[bold green]PASS[/]: {amp} is within the tolerance of FP32 (paired over {len(r.seeds)} seeds)")
    elif r.verdict == "inconclusive":
        out.print(f"[bold yellow]INCONCLUSIVE[/]: {amp} is neither shown within the tolerance of FP32 nor beyond it")
        for reason in r.reasons:
            out.print(f"  - {reason}", highlight=False)
    else:
        out.print(f"[bold red]FAIL[/]: {amp} does not match FP32")
        for reason in r.reasons:
            out.print(f"  - {reason}", highlight=False)
    _regions(out, r)
    _explain(out, r)
    if r.verdict == "fail" and r.explain is None:
        # --explain is for tasks: a script's next step is diagnose (verify.next_step)
        out.print("next: " + (" ".join(after_failure(r)) if r.source else
                              "add --explain to find the module that adds the error and a fix that passes"),
                  highlight=False, soft_wrap=True)
    elif r.passed:
        out.print(f"next: {next_step(r)}", highlight=False, soft_wrap=True)
    elif r.verdict == "inconclusive" and r.continuation is not None and r.report:
        more = max((e.get("seeds_to_decide") or 0 for e in r.effects.get("endpoints", [])), default=0)
        if more > len(r.seeds):
            out.print(f"next: the same command with --seeds {more} --continue trains only the {more - len(r.seeds)} "
                      f"missing seeds and judges all {more}", highlight=False, soft_wrap=True)
    if r.source:
        out.print(f"runs came from your script: {r.task_description} (each run a fresh process; outputs: "
                  f"{r.source.get('runs_folder') or 'not kept'})", highlight=False, soft_wrap=True)
    if r.report:
        out.print(f"report: {r.report}  (json: {r.report.rsplit('/', 1)[0]}/compare.json)", highlight=False)


def _effects(out, r) -> None:
    """The paired tests: harm (AMP worse than FP32, same seed) with its bounds, the tolerance and the resolution."""
    from rich.table import Table

    ends = (r.effects or {}).get("endpoints") or []
    if not ends:
        return
    pct = lambda v: "n/a" if v is None else f"{v:+.2%}"  # noqa: E731
    t = Table(title=f"{r.precision.upper()} minus FP32, paired by seed (harm: + is worse, relative to FP32)",
              title_justify="left")
    for col in ("quantity", "harm", "bounds", "tolerance", "resolution", "decision"):
        t.add_column(col, justify="left" if col in ("quantity", "decision") else "right")
    for e in ends:
        t.add_row(e["name"], pct(e["mean"]), f"{pct(e['lower'])} .. {pct(e['upper'])}", f"{e['tolerance']:.2%}",
                  "n/a" if e["detectable"] is None else f"{e['detectable']:.2%}", e["decision"])
    out.print(t)


def _regions(out, r) -> None:
    if not r.regions:
        return
    info = r.regions
    out.print(f"FP32 regions ({', '.join(r.fp32_modules)}): {', '.join(info['names'])}", highlight=False)
    for row in info["per_region"]:
        mem = row.get("memory_added_bytes")
        out.print(f"  {row['spec']}: {row['step_s_added'] * 1e3:+.2f} ms per forward+backward "
                  f"({_num(row.get('slowdown'), '{:.2f}x')}), memory "
                  + ("n/a" if mem is None else f"{mem / 2**20:+,.1f} MiB"), highlight=False)


def _explain(out, r) -> None:
    from rich.table import Table

    e = r.explain
    if e is None:
        return
    out.print("[bold]explain[/]")
    t = Table(title="modules by the error they add (relative to FP32, one batch)", title_justify="left")
    for col in ("module", "type", "added", "forward", "backward", "inside"):
        t.add_column(col, justify="right" if col in ("added", "forward", "backward") else "left")
    pct = lambda v: "inf/NaN" if v is None else f"{v:.3%}"  # noqa: E731
    for m in e["ranking"][:8]:
        t.add_row(m["module"], m["type"], pct(m["added"]), pct(m["fwd"]), pct(m["bwd"]), (m["events"][0].split(";")[0] + (f" (+{len(m['events']) - 1})" if len(m["events"]) > 1 else ""))
                  if m["events"] else "")
    out.print(t)
    for line in e["summary"]:
        out.print(f"  {line}", highlight=False)
    for n in e["notes"]:
        out.print(f"  note: {n}", highlight=False)
    rec = e.get("recommendation")
    if rec:
        out.print(f"[bold green]recommended[/]: {rec['flags']}", highlight=False)
        out.print(f"  {rec['compare_command']}", highlight=False, soft_wrap=True)
        out.print(f"  python: {rec['python']}", highlight=False, soft_wrap=True)
