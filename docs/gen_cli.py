"""Generate the CLI reference (docs/reference/cli.md) from ampkit's argparse parsers.

Run by mkdocs-gen-files at build time, so the page cannot drift from the code. To preview it:
``PYTHONPATH=src python docs/gen_cli.py``. tests/docs/test_cli_reference.py checks that every
subcommand and every flag of the parser is in it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = "reference/cli.md"


def _parser() -> argparse.ArgumentParser:
    # Document this checkout's parser, not whichever ampkit happens to be installed.
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from ampkit.cli import build_parser

    return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Subcommand name -> its parser, in the order `ampkit --help` shows them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        mv = action.metavar or (action.dest.upper() if not action.choices else None)
        if mv is None:
            mv = "{" + ",".join(map(str, action.choices)) + "}"
        metavar = f" {mv}" if action.nargs in (None, 1) else f" {mv}..."
    return ", ".join(f"`{s}{metavar}`" for s in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default is False:
        return ""
    if isinstance(action.default, (list, tuple)):
        return " ".join(f"`{v}`" for v in action.default) if action.default else ""
    return f"`{action.default}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        text = ""
    else:
        # The plain formatter: the default has its own column.
        text = argparse.HelpFormatter(parser.prog)._expand_help(action)
    if action.choices is not None and action.nargs != 0 and not all(str(c) in text for c in action.choices):
        text += f" (choices: {', '.join(f'`{c}`' for c in action.choices)})"
    return _cell(text)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        rows.append(f"| {_flag(action)} | {_default(action)} | {_help(parser, action)} |")
    return rows


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole CLI reference as Markdown."""
    parser = parser or _parser()
    subs = subcommands(parser)
    out = [
        "# CLI reference",
        "",
        "Generated from ampkit's argparse parsers when the site is built (`docs/gen_cli.py`), so it lists",
        "exactly the flags of this version. Every command also has `--help` with examples. Exit codes:",
        "[errors and exit codes](errors.md).",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
    for name in subs:
        out.append(f"| [`ampkit {name}`](#ampkit-{name}) | {_cell(helps.get(name, ''))} |")
    out += ["", "Options of `ampkit` itself:", ""] + _arguments(parser)
    for name, sub in subs.items():
        out += ["", f"## `ampkit {name}`", ""]
        if sub.description:
            out += [sub.description.strip(), ""]
        out += ["```text", sub.format_usage().strip(), "```", ""]
        out += _arguments(sub)
        if sub.epilog:
            out += ["", "```text", sub.epilog.strip("\n"), "```"]
    return "\n".join(out) + "\n"


if __name__ == "<run_path>":  # mkdocs-gen-files runs this file with runpy.run_path
    import mkdocs_gen_files

    with mkdocs_gen_files.open(PAGE, "w") as fh:
        fh.write(render())
    mkdocs_gen_files.set_edit_path(PAGE, "gen_cli.py")
elif __name__ == "__main__":
    sys.stdout.write(render())
