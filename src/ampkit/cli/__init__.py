"""Command-line entry point. Thin: parse, call a module, render.

Each command lives in its own module under ``ampkit.cli`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` that sets ``func`` (``args -> int``).
Errors derived from :class:`ampkit.errors.AmpkitError` become one line on stderr and
their exit code; nothing here prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ampkit.cli.output import OutputError, guarded_stdout, os_error_line, silence_stdout
from ampkit.errors import AmpkitError
from ampkit.verify.interrupt import Interrupted

__all__ = ["main", "build_parser", "COMMANDS"]

# Order is the order shown in --help.
COMMANDS = ("doctor", "train", "compare", "audit", "diagnose", "migrate", "bench", "parity")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" once, and only where it says something: not when the help already names its default,
    nor for switches, empty lists or None (the help says what not giving the option means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or default is None or default is False or default == [] \
                or default == argparse.SUPPRESS or action.nargs == 0 or not action.option_strings:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from ampkit import __version__

    parser = _Parser(
        prog="ampkit",
        description="Mixed-precision training, right by construction and proven on your hardware.",
        formatter_class=_Formatter,
        epilog="examples:\n  ampkit doctor\n  ampkit compare\n  ampkit train --task digits --precision bf16\n",
    )
    parser.add_argument("--version", action="version", version=f"ampkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"ampkit.cli.{name}")
        except ModuleNotFoundError as exc:  # a command not built yet in this checkout
            if exc.name == f"ampkit.cli.{name}":
                continue
            raise
        module.register(sub, formatter_class=_Formatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from ampkit.cli.precheck import precheck

        precheck(args)  # before any command imports torch: a bad value is rejected in well under 2 s
        with guarded_stdout():  # a full or unwritable stdout: one line (OutputError), not a traceback
            return int(args.func(args) or 0)
    except AmpkitError as exc:
        print(f"ampkit {args.command}: error: {exc}", file=sys.stderr)
        if isinstance(exc, OutputError):
            silence_stdout()
        return exc.exit_code
    except Interrupted as exc:  # compare: a signal ends the whole comparison, and nothing cut short is judged
        tail = ": no verdict was written" if args.command == "compare" else ""
        print(f"ampkit {args.command}: {exc}{tail}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"ampkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `ampkit ... | head`: stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # a file or folder a command writes: full disk, read-only, no permission
        print(f"ampkit {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
