"""Fast, clear feedback from the command line: bad values rejected before torch loads, help that says each
option once, whole lines when the output is a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ampkit.cli import build_parser

HERE = os.path.dirname(__file__)

BAD = [
    (["train", "--steps", "-1"], "--steps must be >= 1"),
    (["compare", "--steps", "-1"], "--steps must be >= 1"),
    (["compare", "--lr", "-1"], "--lr must be a positive number"),
    (["train", "--lr", "nan"], "--lr must be a positive number"),
    (["train", "--accumulation-steps", "0"], "--accumulation-steps must be >= 1"),
    (["compare", "--seeds", "0"], "--seeds must be >= 1"),
    (["train", "--task", "missing.py:make_task"], "task file 'missing.py' does not exist"),
    (["compare", "--task", "missing.py:make_task"], "task file 'missing.py' does not exist"),
    (["audit", "--task", "missing.py:make_task"], "task file 'missing.py' does not exist"),
    (["bench", "--model", "missing.py:make_task"], "task file 'missing.py' does not exist"),
    (["train", "--callback", "gone.py:make"], "callback file 'gone.py' does not exist"),
    (["diagnose", "missing_script.py"], "script not found: missing_script.py"),
    (["bench", "--rounds", "0"], "--rounds must be >= 1"),
]

PROBE = ("import sys, time; t0 = time.perf_counter(); from ampkit.cli import main; code = main(sys.argv[1:]); "
         "print(code, 'torch' in sys.modules, round(time.perf_counter() - t0, 3))")


@pytest.mark.parametrize("argv, needle", BAD)
def test_bad_value_is_rejected_before_torch_loads(tmp_path, argv, needle):
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    code, torch_loaded, seconds = proc.stdout.split()
    assert code == "2" and torch_loaded == "False", (proc.stdout, proc.stderr)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in proc.stderr, proc.stderr
    assert float(seconds) < 2.0  # parse + check, no torch: about 0.1 s on the busy 2-core CI machine


def _options():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                yield name, p, action


def test_every_option_has_help_and_says_its_default_once():
    for name, p, action in _options():
        assert action.help, f"ampkit {name} {action.option_strings[-1]} has no help text"
    for name in {n for n, _, _ in _options()}:
        text = subprocess.run([sys.executable, "-m", "ampkit", name, "--help"], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "2000"}, timeout=60).stdout
        for line in text.splitlines():
            assert line.lower().count("default") <= 1, f"ampkit {name} --help: {line.strip()}"
        assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text


def test_piped_output_keeps_lines_whole():
    line = "step 120: loss 0.1234 scale 65536 skipped 0 " + "x" * 120
    code = f"from ampkit.cli.common import console, err_console; console().print({line!r}); err_console().print({line!r})"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.strip() == line and proc.stderr.strip() == line
