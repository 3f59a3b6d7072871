"""``ampkit parity``: does this device compute what the reference computes, within what mixed precision permits?"""

from __future__ import annotations

import argparse

from ampkit.errors import UsageError

EXAMPLES = """examples:
  ampkit parity train.py --lr 3e-4            # first optimizer step on the script's device, every op against the CPU
  ampkit parity --steps 2 train.py            # the first two steps
  ampkit parity --against cuda:1 train.py     # against another device
  ampkit parity --precision bf16 train.py     # the script's autocast regions in BF16
  ampkit parity --json parity.json train.py   # the result as JSON

Each op is replayed on copies of its own inputs, in FP64, on the reference device, and judged against a bound that
follows from the op and the dtype it ran in (docs: "Is my port computing the same?"), so rounding that mixed
precision is allowed to cause is not reported.
exit status: 0 every op within its bound, 1 an op off (or the script failed), 2 usage error, 3 nothing was compared.
Options go before SCRIPT; everything after SCRIPT is passed to it unchanged.
"""


def register(sub, formatter_class):
    p = sub.add_parser(
        "parity", help="compare every op of a script's first steps with a reference device",
        description="Runs SCRIPT as `python SCRIPT ARGS` would for its first N optimizer steps (eagerly) and replays "
                    "every op of the forward and backward on the reference device in FP64, on the same inputs. "
                    "Reports the first op whose result is off beyond what its dtype permits (module, file:line, "
                    "dtypes, error against its bound) and where later ops were off too. Your files are not edited.",
        epilog=EXAMPLES, formatter_class=formatter_class)
    p.add_argument("--against", default="cpu", metavar="DEVICE",
                   help="the reference device: cpu (default), or a device such as cuda:1")
    p.add_argument("--precision", default=None, choices=("bf16", "fp16"),
                   help="run the script's autocast regions in this dtype (default: as the script says)")
    p.add_argument("--steps", type=int, default=1, metavar="N", help="optimizer steps to record (default 1)")
    p.add_argument("--json", default=None, metavar="FILE", dest="json_file",
                   help="also write the result as JSON to FILE ('-' for stdout)")
    p.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ampkit.cli.diagnose import _check_writable, _console, _write_json
    from ampkit.parity import parity_script

    if args.script is None:
        raise UsageError("SCRIPT is required: ampkit parity [--against cpu] SCRIPT [ARGS...]")
    if args.script.startswith("-"):
        raise UsageError(f"unknown option {args.script!r} (options go before SCRIPT; see ampkit parity --help)")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    _check_writable(args.json_file)
    result = parity_script(args.script, args.args, steps=args.steps, against=args.against, precision=args.precision)
    _write_json(args.json_file, result.to_dict())
    if args.json_file != "-":
        _render(result, _console())
    if result.error is not None or result.first is not None:
        return 1
    return 0 if result.ops_checked else 3


def _render(r, out) -> None:
    out.print(f"\nampkit parity {r.script}: {r.steps} optimizer step(s) on {r.device}, every op against {r.reference} "
              f"in FP64 ({r.ops_checked} ops compared, {r.ops_skipped} not compared: views, random, optimizer; "
              f"{r.seconds:.1f} s, {r.replay_seconds:.1f} s of it replaying)", highlight=False)
    if r.not_replayable:
        out.print(f"  not replayable on {r.reference}: {', '.join(sorted(r.not_replayable))}", highlight=False)
    if r.error is not None:
        out.print(f"  the script stopped with {r.error}", highlight=False)
    if r.first is None:
        if r.ops_checked:
            out.print(f"same: every op within its bound (worst {r.worst_ratio:.2f} of its bound)", highlight=False)
        else:
            out.print("nothing was compared: the script ran no op before its first optimizer step", highlight=False)
        return
    f = r.first
    out.print(f"DIFFERENT: {r.off} op(s) off beyond their bound; the first:", highlight=False)
    out.print(f"  {f.op} ({f.phase}) in {f.module} at {f.where}", highlight=False)
    out.print(f"  inputs {', '.join(f.dtypes)} -> {f.out_dtype}: error {f.max_error:.3g}, {f.ratio:.3g}x its bound",
              highlight=False)
    if r.spread:
        out.print("  later ops off in: " + ", ".join(f"{m} ({n})" for m, n in r.spread), highlight=False)
