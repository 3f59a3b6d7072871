"""``ampkit migrate``: thin CLI over :mod:`ampkit.migrate` (parse flags, call, render)."""

from __future__ import annotations

import sys

__all__ = ["register", "run"]

# Kept literal so `ampkit --help` does not import libcst; tests check them against the library.
TARGET_CHOICES = ("agnostic", "cuda", "musa")
DEFAULT_MUSA_VERSION = "2.7"  # ampkit.migrate.context.DEFAULT_MUSA_VERSION
AUTOLOAD_MUSA_VERSION = "2.1"

_EPILOG = """examples:
  ampkit migrate train.py                      show the diff and the findings
  ampkit migrate --fix src/                    rewrite every .py file under src/
  ampkit migrate --target musa --fix train.py  port CUDA code to a Moore Threads card
  ampkit migrate --target musa --musa-version 2.0 --fix src/   ... for torch_musa 2.0 (adds import torch_musa)
  ampkit migrate --select unsafe-torch-load,host-sync-per-step .
  ampkit migrate --json src/ > migrate.json    one object per file: changes, findings, errors

Files found in folders that mention nothing migrate looks for (torch, amp, autocast, cuda, ...)
are not parsed; the others are analysed on every CPU (--jobs). With --target musa (or cuda) the
last lines say what could not be ported, one line per kind (device counting, vendor checks,
framework names, ...) with the count and where, and which torch_musa release was assumed.

exit codes: 0 nothing to change or report, 1 changes or findings, 2 error: bad usage, or one
or more files skipped (each named on one line with the reason, and left untouched; the other
files were still checked and, with --fix, written)."""


def register(sub, formatter_class):
    """Add the ``migrate`` sub-command to ``sub`` (argparse subparsers)."""
    p = sub.add_parser(
        "migrate",
        help="rewrite deprecated / CUDA-only AMP code and lint AMP misuse",
        description=(
            "Rewrite torch.cuda.amp / torch.cpu.amp / torch.musa.amp calls to torch.amp with an\n"
            "explicit device, optionally move device-specific code to one vendor (--target), and\n"
            "report AMP misuse with stable codes. Prints a unified diff unless --fix is given."
        ),
        epilog=_EPILOG,
        formatter_class=formatter_class,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="Python files or folders (searched for *.py)")
    p.add_argument("--fix", action="store_true", help="write the changes (atomically) instead of printing a diff")
    p.add_argument("--target", choices=TARGET_CHOICES, default="agnostic",
                   help="agnostic: keep the device the code uses; cuda/musa: move device strings, .cuda(), "
                        "torch.cuda.* runtime calls and nccl/mccl to that vendor")
    p.add_argument("--select", metavar="CODES", default=None,
                   help="comma-separated finding codes to check and fix; all when not given")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list on stdout, one object per file: path, changed, written, analysed, "
                        "error, diff, findings [{code, message, where, line, fix, rewritten, kind}]")
    p.add_argument("--musa-version", default=None, metavar="VERSION",
                   help=f"with --target musa: the torch_musa release the code will run on (default "
                        f"{DEFAULT_MUSA_VERSION}); before 2.1 torch_musa does not load itself, so files that now "
                        "use musa get `import torch_musa`")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes for the files that need analysis (default: every CPU)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Migrate ``args.paths``; returns 0 (clean), 1 (changes or findings) or 2 (an error, or a file skipped)."""
    from ampkit.migrate import migrate_paths

    select = None
    if args.select is not None:
        select = [c.strip() for c in args.select.split(",") if c.strip()]
    import signal

    from ampkit.verify.interrupt import Interrupted, stop_on_signals

    try:
        # A stop signal ends the worker processes at once (not after the files already queued for them).
        with stop_on_signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
            results = migrate_paths(args.paths, fix=args.fix, target=args.target, select=select, jobs=args.jobs,
                                    musa_version=args.musa_version)
    except Interrupted as stop:
        done = ("files are rewritten only after all are analysed, each atomically: none is half-written"
                if args.fix else "nothing was written")
        raise Interrupted(stop.signum, f"(the worker processes stopped; {done})") from None
    errors = [r for r in results if r.error]
    if args.json:
        from ampkit.cli.common import print_json

        print_json([file_json(r) for r in results])
    else:
        _render(results, args.fix)
    for r in errors:
        print(f"ampkit migrate: error: {r.error}", file=sys.stderr)
    findings = sum(len(r.findings) for r in results)
    if errors and len(errors) == len(results):
        return 2  # nothing was checked: the error line says it all (no summary of zeros)
    if not args.json:
        changed = sum(r.changed for r in results if not r.error)
        analysed = sum(r.analysed for r in results if not r.error)
        verb = "rewritten" if args.fix else "would change"
        print(f"{len(results) - len(errors)} file(s) checked ({analysed} analysed), {changed} {verb}, "
              f"{findings} finding(s)" + (f", {len(errors)} skipped" if errors else ""), file=sys.stderr)
        if args.target != "agnostic":
            for line in port_summary(results, args.target, args.musa_version):
                print(line, file=sys.stderr)
    if errors:
        return 2
    return 1 if any(r.changed for r in results) or findings else 0


def file_json(r) -> dict:
    """One file's result as the ``--json`` output gives it (the documented schema)."""
    return {
        "path": r.path,
        "changed": r.changed,
        "written": r.written,
        "analysed": r.analysed,
        "error": r.error,
        "diff": r.diff if not r.error else "",
        "findings": [{"code": f.code, "message": f.message, "where": f.where(), "line": f.line,
                      "fix": f.fix, "rewritten": f.rewritten, "kind": f.kind} for f in r.findings],
    }


def port_summary(results, target: str, musa_version: str | None, shown: int = 5) -> list[str]:
    """What ``--target`` could not port, one line per kind (count, files, the first places), and which
    torch_musa release was assumed."""
    from ampkit.migrate.findings import PORT_KINDS

    lines = []
    for kind in PORT_KINDS:
        found = [f for r in results if not r.error for f in r.findings if f.kind == kind]
        if not found:
            continue
        files = len({f.path for f in found})
        where = ", ".join(f.where() for f in found[:shown]) + (", ..." if len(found) > shown else "")
        lines.append(f"could not port ({kind}): {len(found)} in {files} file(s): {where}")
    if target == "musa":
        from ampkit.migrate.context import AUTOLOAD_MUSA_VERSION as autoload, parse_musa_version

        version = musa_version or DEFAULT_MUSA_VERSION
        added = sum(r.changed and _imports_musa(r.new_code) > _imports_musa(r.original) for r in results if not r.error)
        given = "--musa-version" if musa_version else "the default; --musa-version to change"
        head = f"torch_musa {version} ({given}): "
        if (parse_musa_version(version) or autoload) >= autoload:
            lines.append(head + f"no `import torch_musa` added; releases from {AUTOLOAD_MUSA_VERSION} on load "
                         "themselves with torch (for an older one: --musa-version 2.0)")
        else:
            lines.append(head + f"`import torch_musa` added to {added} file(s) that now use musa; releases "
                         f"before {AUTOLOAD_MUSA_VERSION} do not load themselves")
    return lines


def _imports_musa(code: str) -> int:
    import re

    return len(re.findall(r"^[ \t]*import torch_musa\b", code, re.MULTILINE))


def _render(results, fix: bool) -> None:
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)
    for r in results:
        if r.error:
            continue
        if fix and r.written:
            out.print(f"rewrote {r.path}", style="green")
        elif r.diff:
            _print_diff(out, r.diff)
    for r in results:
        for f in r.findings:
            _print_finding(out, f, fix)


def _print_diff(out, diff: str) -> None:
    if not out.is_terminal:  # plain, so it can be piped to `patch` or `git apply`
        sys.stdout.write(diff)
        return
    from rich.text import Text

    styles = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))
    for line in diff.splitlines():
        style = next((s for prefix, s in styles if line.startswith(prefix)), "")
        out.print(Text(line, style=style))


def _print_finding(out, f, fix: bool) -> None:
    from rich.text import Text

    state = ("fixed" if fix else "fixable with --fix") if f.rewritten else "manual fix"
    head = Text()
    head.append(f"{f.where()}: ", style="bold")
    head.append(f.code, style="yellow")
    head.append(f" {f.message} ")
    head.append(f"[{state}]", style="dim")
    out.print(head)
    for i, line in enumerate(f.fix.splitlines()):
        out.print(Text(("    fix: " if i == 0 else "         ") + line, style="cyan"))
