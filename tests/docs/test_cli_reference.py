"""The generated CLI reference (docs/gen_cli.py) lists every subcommand and every flag of the parser."""

from __future__ import annotations

import argparse
import importlib.util

from ampkit.cli import build_parser
from docs_examples import ROOT


def _gen():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_subcommand_and_flag_is_in_the_reference():
    gen = _gen()
    parser = build_parser()
    page = gen.render(parser)
    subs = gen.subcommands(parser)
    assert set(subs) >= {"doctor", "train", "compare", "audit", "diagnose", "migrate", "bench"}
    for name, sub in subs.items():
        section = page.split(f"## `ampkit {name}`", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for flag in names:
                assert f"`{flag}" in section, f"ampkit {name} {flag} is missing from the CLI reference"


def test_a_new_flag_shows_up():
    # The page is built from the parser, not written by hand: a flag added to a parser appears in it.
    gen = _gen()
    parser = build_parser()
    sub = gen.subcommands(parser)["doctor"]
    sub.add_argument("--brand-new-flag", metavar="X", default="7", help="added by the test")
    section = gen.render(parser).split("## `ampkit doctor`", 1)[1].split("\n## ", 1)[0]
    assert "| `--brand-new-flag X` | `7` | added by the test |" in section


def test_the_site_builds_the_page_from_the_generator():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "docs/gen_cli.py" in config and "reference/cli.md" in config
    assert not (ROOT / "docs" / "reference" / "cli.md").exists(), "cli.md is generated: do not commit one"
