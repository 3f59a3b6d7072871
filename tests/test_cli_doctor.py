import json
import subprocess
import sys

import pytest

from ampkit.cli import main


def test_doctor_json_schema(capsys):
    assert main(["doctor", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["schema"] == 1
    assert set(r) >= {"device", "card", "dtypes", "tf32", "fp8", "collectives", "recommended", "versions", "env",
                      "rerun_hint", "notes", "probe_ran"}
    assert set(r["dtypes"]) == {"fp32", "bf16", "fp16"}
    for s in r["dtypes"].values():
        assert set(s) == {"supported", "provenance", "detail", "probe"}
        assert s["provenance"] in ("table", "probe", "unverified")
    assert r["device"]["type"] == "cpu"
    assert r["recommended"]["precision"] in ("bf16", "fp16", "fp32")


def test_doctor_check_usable(capsys):
    assert main(["doctor", "--precision", "fp32"]) == 0
    assert "usable" in capsys.readouterr().out


def test_doctor_simulated_s80_bf16_exit_1(simulated_musa, capsys):
    simulated_musa("MTT S80")
    assert main(["doctor", "--precision", "bf16", "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["check"]["usable"] is False
    assert "MTT S80" in r["check"]["reason"] and "fp16" in r["check"]["reason"]
    assert r["recommended"]["precision"] == "fp16"
    assert r["collectives"]["backend"] == "mccl"
    assert "MUSA_LAUNCH_BLOCKING" in r["env"]


def test_doctor_probe_failure_keeps_table(simulated_musa, capsys):
    simulated_musa("MTT S80")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "MTT S80" in out and "error" in out


@pytest.mark.parametrize("argv", [["doctor", "--precision", "bf17"], ["doctor", "--device", "tpu"],
                                  ["doctor", "--device", "cuda"], ["nosuchcommand"]])
def test_bad_input_one_line_exit_2(argv):
    proc = subprocess.run([sys.executable, "-m", "ampkit", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_has_examples():
    proc = subprocess.run([sys.executable, "-m", "ampkit", "doctor", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "examples:" in proc.stdout


@pytest.mark.parametrize("spelling", ["BF16", "Bfloat16", " fp32 "])
def test_precision_flag_takes_the_api_spellings(spelling, capsys):
    # The CLI and the Python API accept the same names (resolve_precision("BF16") works too).
    assert main(["doctor", "--precision", spelling]) == 0
    assert "usable" in capsys.readouterr().out
