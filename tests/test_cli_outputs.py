"""Outputs that cannot be written and factories that raise: one line on stderr, a non-zero exit, no traceback,
and what was measured kept where possible (the line says where).

A full disk is real: ``/dev/full`` (every write fails with ENOSPC) for stdout and for named files, and a file
size limit (``RLIMIT_FSIZE``, every write past it fails with EFBIG) for the folders train and compare write.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ampkit.cli import main

HERE = Path(__file__).parent
SRC = str(HERE.parent / "src")
TOY = str(HERE / "toy_task.py") + ":make_task"


def _cli(*argv: str, cwd, stdout=subprocess.PIPE, fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:  # a disk that is full after `fsize` bytes of any one file
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "ampkit", *argv], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=300, preexec_fn=limit if fsize else None)


def _one_line(err: str) -> str:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return err.strip().splitlines()[-1]


def _kept(line: str) -> dict:
    path = re.search(r"saved in (\S+\.json)", line).group(1)
    try:
        return json.loads(Path(path).read_text())
    finally:
        os.remove(path)


def test_doctor_json_to_a_full_stdout_keeps_the_report(tmp_path):
    with open("/dev/full", "w") as full:
        proc = _cli("doctor", "--json", cwd=tmp_path, stdout=full)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1
    assert line.startswith("ampkit doctor: error: cannot write to standard output: No space left on device; "
                           "the JSON result is saved in "), line
    assert "device" in _kept(line)


def test_doctor_table_to_a_full_stdout(tmp_path):
    with open("/dev/full", "w") as full:
        proc = _cli("doctor", cwd=tmp_path, stdout=full)
    assert proc.returncode == 1
    assert _one_line(proc.stderr) == "ampkit doctor: error: cannot write to standard output: No space left on device"


def test_a_named_json_file_on_a_full_disk_is_kept_elsewhere():
    from ampkit.cli.output import OutputError, write_json_file

    with pytest.raises(OutputError, match=r"^cannot write --out /dev/full: No space left on device; the JSON is "
                                          r"saved in ") as info:
        write_json_file("/dev/full", {"rows": [1, 2]}, "--out", "bench")
    assert _kept(str(info.value)) == {"rows": [1, 2]}


def test_diagnose_json_to_a_full_disk_shows_and_keeps_the_findings(capsys):
    script = str(HERE / "diagnose" / "scripts" / "host_sync_clean.py")
    code = main(["diagnose", "--steps", "2", "--json", "/dev/full", script])
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert code == 2 and "no findings" in out  # rendered before the file failed
    assert line.startswith("ampkit diagnose: error: cannot write --json /dev/full: No space left on device; the "
                           "findings are saved in "), line
    assert _kept(line) == []


@pytest.mark.slow  # two short trainings in a subprocess: 20-35 s on the busy 2-core machine
def test_compare_on_a_full_disk_says_the_verdict(tmp_path):
    proc = _cli("compare", "--task", TOY, "--steps", "4", "--seeds", "1", "--no-audit", "--out", "cmp",
                cwd=tmp_path, fsize=4000)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1
    assert re.fullmatch(r"ampkit compare: error: cannot write the report into cmp: File too large; the verdict was "
                        r"(pass|fail|inconclusive), and compare\.json could not be saved elsewhere either", line), line


@pytest.mark.slow  # about 20 s on the busy 2-core machine
def test_train_on_a_full_disk(tmp_path):
    proc = _cli("train", "--task", TOY, "--steps", "4", "--ckpt-every", "2", "--out", "run", cwd=tmp_path, fsize=2000)
    assert proc.returncode == 1
    assert _one_line(proc.stderr).startswith("ampkit train: error: cannot write checkpoint run/checkpoints/"), \
        proc.stderr


@pytest.mark.slow  # about 30 s of measuring on the busy 2-core machine before the write fails
def test_bench_out_to_a_full_disk_keeps_what_was_measured(tmp_path):
    proc = _cli("bench", "--model", "digits", "--precision", "fp32", "--steps", "2", "--warmup", "1", "--rounds", "1",
                "--runners", "ampkit", "--out", "/dev/full", cwd=tmp_path)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1
    assert line.startswith("ampkit bench: error: cannot write --out /dev/full: No space left on device; the JSON "
                           "is saved in "), line
    assert _kept(line)["rows"]


FACTORY = '''
import os


def make_task(seed=0):
    with open(os.path.join(os.path.dirname(__file__), "data.csv")) as f:  # line 6
        return f.read()
'''


@pytest.mark.parametrize("argv", [["train", "--steps", "1"], ["compare", "--steps", "1", "--seeds", "1"],
                                  ["bench", "--steps", "1"]], ids=lambda a: a[0])
def test_any_error_of_a_user_factory_is_one_line_that_names_it(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytask.py").write_text(FACTORY)
    flag = "--model" if argv[0] == "bench" else "--task"
    code = main([*argv, flag, "mytask.py:make_task", *(["--out", "o"] if argv[0] != "bench" else [])])
    line = _one_line(capsys.readouterr().err)
    assert code == 2
    assert line == (f"ampkit {argv[0]}: error: FileNotFoundError: [Errno 2] No such file or directory: "
                    f"'{tmp_path / 'data.csv'}' (in your factory mytask.py:make_task, mytask.py:6): fix the factory, "
                    "or the options given to it with --task-arg"), line


def test_migrate_diff_to_a_full_stdout(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    with open("/dev/full", "w") as full:
        proc = _cli("migrate", str(script), cwd=tmp_path, stdout=full)
    assert proc.returncode == 1
    assert _one_line(proc.stderr) == "ampkit migrate: error: cannot write to standard output: No space left on device"
