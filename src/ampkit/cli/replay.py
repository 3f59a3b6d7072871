"""``ampkit diagnose --replay RUN_DIR[:STEP]``: the options and the report (the work: :mod:`ampkit.diagnose.replay`)."""

from __future__ import annotations

from typing import Any, Callable

from ampkit.errors import UsageError

__all__ = ["add_replay_args", "run_replay"]


def add_replay_args(p) -> None:
    p.add_argument("--replay", default=None, metavar="RUN_DIR[:STEP]",
                   help="replay a run of `ampkit train --out RUN_DIR` from its last good checkpoint to its first "
                        "bad step (or STEP) and name the op that went inf/NaN; then replay that step in FP32 to "
                        "tell precision from model or data")
    p.add_argument("--fix-check", action="store_true",
                   help="with --replay: train a few steps past the bad step with the suggested --fp32-modules, "
                        "from the same checkpoint, to show the fix holds")
    p.add_argument("--device", default=None, metavar="DEV",
                   help="with --replay: the device to replay on (default: $AMPKIT_DEVICE, else detected)")


def run_replay(args, write_json: Callable[[str | None, Any], None], console: Callable[[], Any]) -> int:
    from ampkit.diagnose.replay import parse_target, replay_run

    if args.replay is None:
        raise UsageError("--fix-check goes with --replay RUN_DIR")
    if args.script is not None:
        raise UsageError(f"--replay replays a run folder, not a script: drop {args.script!r}")
    run_dir, step = parse_target(args.replay)
    result = replay_run(run_dir, step=step, fix_check=args.fix_check, device=args.device)
    write_json(args.json_file, result.to_dict())
    if args.json_file != "-":
        _render(result, console())
    return 1 if result.finding is not None or result.cause != "not-reproduced" else 0


def _render(r, out) -> None:
    from rich.markup import escape

    from ampkit.diagnose.findings import TITLES

    origin = escape(r.checkpoint) if r.checkpoint else "the run's start, rebuilt from its seed"
    out.print(f"\n[bold]ampkit diagnose --replay[/] {escape(r.run_dir)}: {r.precision} from {origin} "
              f"(step {r.checkpoint_step})")
    for note in r.notes:
        out.print(f"note: {escape(note)}")
    if r.step is None or (r.finding is None and r.cause == "not-reproduced"):
        out.print("[green]the replay reproduced no non-finite step[/]")
        return
    f = r.finding
    if f is not None:
        title = escape(TITLES.get(f.code, ""))
        out.print(f"\n[bold red]{f.code}[/] — {title} · first bad step {r.step} ({r.phase})")
        out.print(f"   [bold]where:[/] {escape(f.where)}")
        if r.op_where:
            out.print(f"   [bold]op:[/]    `{escape(r.op or '?')}` at {escape(r.op_where)}")
        out.print(f"   [bold]why:[/]   {escape(f.message)}")
    fp32 = "stays finite" if r.fp32_finite else "is not finite either"
    out.print(f"   [bold]FP32:[/]  step {r.step} from the same state {fp32}: "
              + ("[yellow]precision is the cause[/]" if r.cause == "precision" else "[red]the model or the data[/]"))
    if r.suggestion:
        out.print(f"   [bold]fix:[/]   {escape(r.suggestion)}")
    fc = r.fix_check
    if fc is None and r.cause == "precision":
        out.print(f"   [bold]check:[/] `ampkit diagnose --replay {escape(r.run_dir)} --fix-check` trains a few steps "
                  f"past step {r.step} with it, from the same checkpoint")
    if fc is not None:
        verdict = ("[green]holds[/]: no step skipped" if fc["holds"]
                   else f"[red]does not hold[/]: skipped {fc['skipped_steps']}")
        out.print(f"   [bold]fix check:[/] --fp32-modules {escape(fc['fp32_modules'])}, steps {fc['from_step']}-"
                  f"{fc['to_step']} from the same checkpoint: {verdict}")
