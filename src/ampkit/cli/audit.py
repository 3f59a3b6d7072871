"""``ampkit audit``: which ops ran in which dtype under autocast, per op type and per module."""

from __future__ import annotations

import argparse

from ampkit.cli.common import add_device_arg, add_precision_arg, console, print_json
from ampkit.cli.common import add_fp32_modules_arg
from ampkit.cli.train import add_task_args

EXAMPLES = """examples:
  ampkit audit                                     # digits, the device's low precision
  ampkit audit --precision fp16 --json             # every op with its dtypes, as JSON
  ampkit audit --task mytask.py:make_task          # your model: task.loss(model, first batch)
  ampkit audit --precision fp16 --fp32-modules preset:norm   # FP32 regions: declared, not surprises
  ampkit audit train.py --epochs 1                 # YOUR script, unmodified: the ops of its first optimizer step

Categories: low (FP16/BF16), promoted (FP32 from low-precision inputs: autocast's FP32 list),
fp32 (kept), fp64, cast. Surprises: a matmul kept in FP32 under autocast (autocast(enabled=False),
FP64 input), FP64 compute, hand-cast FP16/BF16 weights.
"""


def register(sub, formatter_class):
    p = sub.add_parser("audit", help="which ops ran in which dtype under autocast; matmul FLOPs in low precision",
                       description="One forward and backward of the task's first batch under autocast, with every "
                                   "aten op recorded: its module, input and output dtypes, FLOPs of matmul-like ops. "
                                   "Generalises `assert outputs.dtype == low_dtype`.",
                       epilog=EXAMPLES, formatter_class=formatter_class)
    add_task_args(p)
    add_precision_arg(p)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the audit (with every op) as JSON")
    add_fp32_modules_arg(p)
    p.add_argument("script", nargs="?", default=None, metavar="SCRIPT",
                   help="your training script, run unmodified in a fresh process up to its first optimizer step "
                        "(instead of --task); --precision bf16/fp16 forces its autocast dtype")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT")
    p.set_defaults(func=run)
    return p


_COLORS = {"low": "blue", "promoted": "yellow", "fp32": "white", "fp64": "red", "mixed": "magenta", "cast": "cyan"}


def _tag(cat: str) -> str:
    return f"[{_COLORS.get(cat, 'white')}]{cat}[/]"


def _run_script(args) -> int:
    from ampkit.errors import UsageError
    from ampkit.verify.script_compare import audit_script

    if args.script.startswith("-"):
        raise UsageError(f"unknown option {args.script!r} (options go before SCRIPT; see ampkit audit --help)")
    for flag, value, default in (("--task", args.task, "digits"), ("--task-arg", args.task_arg, []),
                                 ("--device", args.device, None), ("--fp32-modules", args.fp32_modules, None)):
        if value != default:
            raise UsageError(f"{flag} is for tasks, not for a SCRIPT (the script decides its model and device): drop it")
    import signal

    from ampkit.verify.interrupt import Interrupted, stop_on_signals

    try:
        with stop_on_signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):  # stops the script's run with ampkit
            result = audit_script(args.script, args.script_args, precision=args.precision)
    except Interrupted as stop:
        raise Interrupted(stop.signum, "(the script's run stopped, with all it started; nothing was audited)") \
            from None
    reason = "as the script runs it" if args.precision in (None, "auto") else f"--precision {args.precision} forced"
    if args.json:
        print_json({"task": args.script, "script": args.script, "args": args.script_args, "reason": reason,
                    **result.to_dict()})
        return 0
    _render(result, f"{args.script} (first optimizer step)", reason)
    return 0


def run(args) -> int:
    if args.script is not None:
        return _run_script(args)
    from ampkit.device import detect_device
    from ampkit.device.policy import resolve_precision
    from ampkit.tasks import load_task, parse_task_args
    from ampkit.verify.audit import audit_task

    device = detect_device(args.device)
    precision = resolve_precision(args.precision, device)
    task = load_task(args.task, options=parse_task_args(args.task_arg), device=device.torch_device)
    result = audit_task(task, precision=precision, fp32_modules=args.fp32_modules)
    if args.json:
        print_json({"task": task.name, "reason": precision.reason, **result.to_dict()})
        return 0
    _render(result, task.name, precision.reason)
    return 0


def _render(r, task: str, reason: str) -> None:
    from rich.table import Table

    out = console()
    out.print(f"[bold]{task}[/] on {r.device} under {r.precision.upper()} autocast ({reason})", highlight=False)
    t = Table(title="per module (forward)", title_justify="left")
    for col in ("module", "type", "ran in", "ops", "FLOPs"):
        t.add_column(col, justify="right" if col == "FLOPs" else "left")
    for m in r.by_module():
        ops = ", ".join(k.split(":")[0] + ("" if k.split(":")[1] == m["verdict"] else f" ({k.split(':')[1]})")
                        for k in m["ops"])
        t.add_row(m["module"], m["type"], _tag(m["verdict"]), ops, f"{m['flops']:,}")
    out.print(t)
    t = Table(title="per op type", title_justify="left")
    for col in ("op", "phase", "calls", "low", "promoted", "fp32", "fp64", "cast", "FLOPs"):
        t.add_column(col, justify="left" if col in ("op", "phase") else "right")
    for o in r.by_op():
        t.add_row(o["op"], o["phase"], str(o["calls"]), *(str(o[c] or "") for c in ("low", "promoted", "fp32", "fp64",
                                                                                       "cast")), f"{o['flops']:,}")
    out.print(t)
    share = "n/a (no matmul-like ops)" if r.matmul_share is None else f"{r.matmul_share:.0%}"
    out.print(f"model output dtype: {r.output_dtype}; matmul FLOPs in low precision: [bold]{share}[/]"
              + ("" if r.forward_matmul_share is None else f" (forward {r.forward_matmul_share:.0%})"), highlight=False)
    for d in r.declared:
        out.print(f"[cyan]declared[/]: {d['message']}", highlight=False)
    for s in r.surprises:
        out.print(f"[yellow]surprise {s.kind}[/]: {s.message}. fix: {s.fix}", highlight=False)
    if not r.surprises:
        aside = " outside the declared FP32 regions" if r.declared else ""
        out.print(f"no surprises: no matmul kept in FP32 under autocast{aside}, no FP64, no hand-cast weights")
    for n in r.notes:
        out.print(f"note: {n}")
