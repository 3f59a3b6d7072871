"""The command-line contract of DESIGN.md: names users and scripts depend on. Extend, don't rename."""

import subprocess
import sys

import pytest

from ampkit.cli import build_parser

CONTRACT = {
    "doctor": ["--precision", "--json"],
    "train": ["--task", "--precision", "--steps", "--seed", "--out", "--ckpt-every", "--resume", "--log-every",
              "--strategy", "--nproc", "--max-restarts", "--init-scale", "--callback", "--stop-signal",
              "--stop-check-every", "--no-graph", "--fp32-modules"],
    "compare": ["--task", "--precision", "--seeds", "--steps", "--out", "--fp32-modules", "--explain",
                "--explain-budget", "--no-graph", "--tolerance", "--metric", "--metric-mode", "--continue", "--nproc"],
    "audit": ["--task", "--precision", "--json", "--fp32-modules"],
    "diagnose": ["--steps", "--json", "--replay", "--fix-check"],
    "migrate": ["--fix", "--target", "--select", "--json", "--jobs", "--musa-version"],
    "bench": ["--model", "--precision", "--compile", "--graph", "--steps", "--json", "--rounds"],
    "parity": ["--against", "--precision", "--steps", "--json"],
}


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


@pytest.mark.parametrize("command,flags", sorted(CONTRACT.items()))
def test_contract_flags_exist(command, flags):
    sub = _subparsers()
    assert command in sub, f"command {command} missing"
    options = {s for a in sub[command]._actions for s in a.option_strings}
    assert set(flags) <= options, set(flags) - options


def test_precision_choices():
    sub = _subparsers()
    for command in ("doctor", "train", "compare", "audit"):
        action = next(a for a in sub[command]._actions if "--precision" in a.option_strings)
        assert tuple(action.choices) == ("auto", "bf16", "fp16", "fp32", "fp8")


def test_help_does_not_import_torch():
    code = "import sys; from ampkit.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
