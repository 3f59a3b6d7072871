"""`ampkit compare` and `ampkit audit` through the real entry point: exit codes, files, JSON, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ampkit.cli import main
from task_specs import HARMFUL, TOY


def test_compare_pass_exit_0_writes_files(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "--task", TOY, "--precision", "bf16", "--seeds", "3", "--steps", "20", "--out", str(out),
                 "--no-audit"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "samples/s" in printed and "report:" in printed
    assert "tolerance" in printed and "resolution" in printed and "late" in printed  # the effects table
    data = json.loads((out / "compare.json").read_text())
    assert data["verdict"] == "pass" and data["audit"] is None
    assert (out / "report.html").exists() and (out / "loss.png").exists() and (out / "throughput.png").exists()


def test_compare_fail_exit_1_json(tmp_path, capsys):
    code = main(["compare", "--task", HARMFUL, "--precision", "fp16", "--seeds", "1", "--steps", "20",
                 "--out", str(tmp_path), "--json", "--no-audit"])
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "fail" and any("non-finite" in r for r in data["reasons"])
    assert data["scale_trace"]["0"]


def test_compare_inconclusive_exit_3(tmp_path, capsys):
    """One seed measures no paired spread: neither pass nor fail, and the exit status says so."""
    code = main(["compare", "--task", TOY, "--precision", "bf16", "--seeds", "1", "--steps", "12", "--out",
                 str(tmp_path), "--no-audit", "--json"])
    assert code == 3
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "inconclusive" and "one seed measures no spread" in data["reasons"][0]
    assert 'data-verdict="inconclusive"' in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("argv, needle", [
    (["compare", "--tolerance", "0"], "--tolerance must be a positive fraction"),
    (["compare", "--seeds", "0"], "--seeds must be >= 1"),
    (["compare", "--steps", "-3"], "--steps must be >= 1"),
    (["compare", "--precision", "fp32", "--steps", "1", "--seeds", "1"], "nothing to compare"),
    (["compare", "--task", "nope"], "unknown task"),
    (["audit", "--task", "missing.py:f"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    code = main(argv + (["--out", str(tmp_path)] if argv[0] == "compare" else []))
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_audit_table_and_json(capsys):
    assert main(["audit", "--task", TOY, "--precision", "bf16"]) == 0
    text = capsys.readouterr().out
    assert "per module" in text and "Linear" in text and "matmul FLOPs in low precision" in text
    assert main(["audit", "--task", TOY, "--precision", "bf16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["matmul_share"] == 1.0 and data["task"] == "toy" and data["ops"]
    assert {m["module"]: m["verdict"] for m in data["by_module"]}["0"] == "low"


def test_help_has_examples():
    for cmd in ("compare", "audit"):
        proc = subprocess.run([sys.executable, "-m", "ampkit", cmd, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "examples:" in proc.stdout
