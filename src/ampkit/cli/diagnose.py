"""``ampkit diagnose``: run an unmodified training script under instrumentation and name its AMP defects."""

from __future__ import annotations

import argparse
import json
import math

from ampkit.errors import UsageError

EXAMPLES = """examples:
  ampkit diagnose train.py --lr 3e-4              # run train.py as `python train.py --lr 3e-4`, 50 steps
  ampkit diagnose --steps 200 train.py            # look further into the run
  ampkit diagnose --json findings.json train.py   # findings as JSON: [{code, message, where, fix, step}]
  ampkit diagnose --fp16-range train.py           # FP32 run: which modules would overflow/underflow FP16
  ampkit diagnose --replay runs/x                 # a halted `ampkit train --out runs/x`: find the op
  ampkit diagnose --replay runs/x:120 --fix-check # replay step 120; check the suggested fix holds

exit status: 0 no findings, 1 findings (or the script failed), 2 usage error, 3 nothing was checked
(the script reached no optimizer step and no autocast region).
Options go before SCRIPT; everything after SCRIPT is passed to it unchanged.
"""


def register(sub, formatter_class):
    p = sub.add_parser(
        "diagnose", help="run a training script under instrumentation and name its AMP defects",
        description="Runs SCRIPT exactly as `python SCRIPT ARGS` would (same __main__, sys.argv, sys.path[0]) "
                    "for at most N optimizer steps, with hooks on modules, GradScaler, optimizer, clipping, "
                    "torch.save and autocast, then reports findings with stable codes, where, why and the fix. "
                    "Your files are not edited.",
        epilog=EXAMPLES, formatter_class=formatter_class)
    p.add_argument("--steps", type=_positive, default=None, metavar="N",
                   help="stop after N optimizer steps (default 50; 5 with --fp16-range)")
    p.add_argument("--json", default=None, metavar="FILE", dest="json_file",
                   help="also write the findings (or the --fp16-range report) as JSON to FILE ('-' for stdout)")
    p.add_argument("--fp16-range", action="store_true",
                   help="run in FP32 (autocast and GradScaler forced off) and predict FP16 overflow/underflow "
                        "per module, the initial loss scale and the modules to keep in FP32")
    from ampkit.cli.replay import add_replay_args

    add_replay_args(p)
    p.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    p.set_defaults(func=run)
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 step, got {value}")
    return value


def run(args) -> int:
    from ampkit.diagnose import diagnose_script, fp16_range_script

    _check_writable(args.json_file)  # before anything runs: a run is not thrown away at the end
    if args.replay is not None or args.fix_check:
        from ampkit.cli.replay import run_replay

        return run_replay(args, _write_json, _console)
    if args.script is None:
        raise UsageError("SCRIPT is required (the training script), or --replay RUN_DIR for a run of `ampkit train`")
    if args.script.startswith("-"):
        raise UsageError(f"unknown option {args.script!r} (options go before SCRIPT; see ampkit diagnose --help)")
    if args.fp16_range:
        report, error = fp16_range_script(args.script, args.args, steps=args.steps or 5)
        payload = {"script": args.script, "error": error, **report.to_dict()}
        if args.json_file != "-":
            _render_range(report, error)
        _write_json(args.json_file, payload)
        return 1 if (report.overflow or report.underflow or report.op_overflow or report.keep_fp32 or error) else 0
    result = diagnose_script(args.script, args.args, steps=args.steps or 50)
    if args.json_file != "-":
        _render(result)  # first: findings shown even if the JSON file then cannot be written
    _write_json(args.json_file, result.to_list())
    if result.findings:
        return 1
    return 0 if result.checked else NOTHING_CHECKED


NOTHING_CHECKED = 3  # docs/reference/errors.md, docs/commands/diagnose.md


def _check_writable(target: str | None) -> None:
    """``--json FILE`` must be writable before anything runs (one line, exit 2, instead of a lost run).
    Probed by opening it for appending (an existing file is left as it is; one made here is removed)."""
    import os

    if target is None or target == "-":
        return
    full = os.path.abspath(target)
    if os.path.isdir(full):
        raise UsageError(f"cannot write --json {target}: it is a folder; pass a file path (or '-' for stdout)")
    existed = os.path.exists(full)
    try:
        with open(full, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write --json {target}: {exc.strerror}; pass a path you can write "
                         "(or '-' for stdout)") from None
    if not existed:
        os.remove(full)


def _write_json(target: str | None, payload) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, default=str, allow_nan=True) + "\n"
    if target == "-":
        from sys import stdout

        stdout.write(text)
        return
    try:
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        from ampkit.cli.output import keep_elsewhere

        kept = keep_elsewhere(payload, "diagnose")
        raise UsageError(f"cannot write --json {target}: {exc.strerror}" +
                         (f"; the findings are saved in {kept}" if kept else "")) from None


def _console():
    """Piped output is not cut at 80 columns (paths and fixes stay whole, one line each)."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=400, soft_wrap=True)


def _render(result) -> None:
    from rich.markup import escape

    from ampkit.diagnose.findings import TITLES

    out = _console()
    if result.traceback:  # the script's own traceback, as `python SCRIPT` would have shown it
        import sys

        print(result.traceback, file=sys.stderr)
    out.print(f"\n[bold]ampkit diagnose[/] {escape(result.script)}: {result.steps} optimizer step(s), {escape(result.stopped)}")
    if not result.findings and not result.checked:
        out.print("[yellow]nothing was checked:[/] the script took no optimizer step and entered no autocast region, "
                  "so no check had anything to look at (pass the arguments it needs after SCRIPT: "
                  "`ampkit diagnose SCRIPT ARGS...`)")
        return
    if not result.findings:
        out.print("[green]no findings[/]")
        return
    for i, f in enumerate(result.findings, 1):
        step = "" if f.step is None else f" · step {f.step}"
        out.print(f"\n[bold red]{i}. {f.code}[/] — {escape(TITLES.get(f.code, ''))}{step}")
        out.print(f"   [bold]where:[/] {escape(f.where)}")
        out.print(f"   [bold]why:[/]   {escape(f.message)}")
        out.print(f"   [bold]fix:[/]   {escape(f.fix)}")
    out.print(f"\n{len(result.findings)} finding(s)")


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def _scale(x: float) -> str:
    exp = math.log2(x)
    return f"{x:g}" if exp >= 0 else f"2^{exp:.0f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _render_range(report, error) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = _console()
    t = Table(title=f"FP16 range from an FP32 run of {report.steps} step(s): FP16 max 65504, subnormal "
                    "below 2^-14, zero below 2^-24; gradient shares at loss scale 1 unless named",
              title_justify="left")
    scale = _scale(report.recommended_scale)
    for col, justify in (("module / param", "left"), ("max |out|", "right"), ("max |grad|", "right"),
                         ("grad→0", "right"), ("subnormal", "right"), (f"→0 @{scale}", "right"), ("FP16", "left")):
        t.add_column(col, justify=justify)
    for r in report.modules:
        flags = []
        if r.overflow_forward:
            flags.append("[red]out overflows[/]")
        if r.overflow_backward_scaled:
            flags.append("[red]grad overflows[/]")
        if (r.grad_zero_share_fp16 or 0) >= 0.5:
            flags.append("[yellow]grad underflows[/]")
        if any(o.module == r.name for o in report.op_overflow):
            flags.append("[red]op inside overflows[/]")
        name = f"{r.name} ({r.type})" if r.type else r.name
        t.add_row(escape(name), _num(r.act_max), _num(r.grad_max), _pct(r.grad_zero_share_fp16),
                  _pct(r.grad_subnormal_share_fp16), _pct(r.grad_zero_share_scaled), ", ".join(flags) or "ok")
    out.print(t)
    for o in report.op_overflow:
        inside = (f"its output ({_num(o.module_output_max)}) fits FP16, so FP16 would overflow inside it and "
                  "the module absorb it silently" if o.absorbed else "its output overflows too")
        out.print(f"[red]op overflow:[/] {escape(o.module)}: `{escape(o.op)}` reaches {_num(o.max)}; {inside}")
    init = f"--init-scale {report.recommended_scale:g}"
    out.print(f"[bold]recommended initial loss scale:[/] {scale}  (`ampkit train {init}`; "
              f"`torch.amp.GradScaler(device, init_scale={report.recommended_scale:g})`)")
    if report.keep_fp32:
        flag = ",".join(report.fp32_modules)
        names = ", ".join(f'"{n}"' for n in report.fp32_modules)
        out.print("[bold]keep in FP32:[/] " + escape(", ".join(report.keep_fp32))
                  + escape(f"  (`ampkit train --fp32-modules {flag} {init}`; Python: "
                           f"`MixedPrecision(..., fp32_modules=[{names}])`; by hand: "
                           "`with torch.autocast(device, enabled=False): y = module(x.float())`)"))
    else:
        out.print("[green]no module output or op inside a module exceeds FP16's range[/]")
    for note in report.notes:
        out.print(f"note: {escape(note)}")
    if error:
        out.print(f"[red]the script raised[/] {escape(error)}")
