"""The ``ampkit diagnose`` command: exit codes, JSON, usage errors (one real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ampkit.cli import main
from ampkit.diagnose import CODES, Finding

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
DESIGN_CODES = ["nonfinite-forward", "nonfinite-backward", "clip-before-unscale", "fp16-params-with-scaler",
                "fp16-without-scaler", "dtype-unsupported", "scale-collapse", "scaler-not-checkpointed",
                "half-inside-autocast", "host-sync-per-step", "deprecated-amp-api", "unsafe-torch-load",
                "scaler-with-bf16", "bce-under-autocast"]


def test_subprocess_json_and_exit_codes(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "ampkit", "diagnose", "--json", str(out),
                           os.path.join(SCRIPTS, "clip_before_unscale.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(out.read_text())
    assert [d["code"] for d in data] == ["clip-before-unscale"]
    assert set(data[0]) == {"code", "message", "where", "fix", "step"}
    assert "clip-before-unscale" in proc.stdout and "Traceback" not in proc.stderr


def test_clean_script_exits_0_and_writes_empty_list(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["diagnose", "--json", str(out), os.path.join(SCRIPTS, "clip_before_unscale_clean.py")]) == 0
    assert json.loads(out.read_text()) == []
    assert "no findings" in capsys.readouterr().out


def test_script_args_pass_through(capsys):
    # 3: the probe takes no training step ("nothing was checked"); a wrong argv would exit 1 (script-exit)
    assert main(["diagnose", "--steps", "5", os.path.join(SCRIPTS, "argv_probe.py"), "--lr", "0.1", "pos"]) == 3


def test_fp16_range_command(tmp_path, capsys):
    out = tmp_path / "range.json"
    rc = main(["diagnose", "--fp16-range", "--steps", "2", "--json", str(out), os.path.join(SCRIPTS, "overflow_fwd.py")])
    assert rc == 1
    data = json.loads(out.read_text())
    assert data["keep_fp32"] == ["model.2"] and data["recommended_scale"] > 0
    text = capsys.readouterr().out
    assert "keep in FP32" in text and "model.2" in text


@pytest.mark.parametrize("argv, needle", [
    (["diagnose", "missing_script.py"], "script not found: missing_script.py"),
    (["diagnose", "--steps", "0", "x.py"], "at least 1 step"),
    (["diagnose", "--bogus", "x.py"], "unrecognized arguments"),
    (["diagnose"], "required"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors exit from the parser
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_codes_are_the_stable_set():
    assert set(DESIGN_CODES) <= set(CODES)
    f = Finding(code="scale-collapse", message="m", where="w", fix="f", step=3)
    assert f.to_dict() == {"code": "scale-collapse", "message": "m", "where": "w", "fix": "f", "step": 3}
    with pytest.raises(Exception):
        f.code = "x"  # frozen
