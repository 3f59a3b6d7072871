"""``ampkit train`` never trains over a run: ``--out`` on a folder that holds one needs ``--resume``, and a
``--resume`` whose checkpoints do not load stops. In both cases every file stays byte for byte as it was."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path

import pytest

from ampkit.cli import main

TOY = os.path.join(os.path.dirname(__file__), "toy_task.py") + ":make_task"


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, err.getvalue()


def _train(out: Path, *extra: str) -> tuple[int, str]:
    return _cli("train", "--task", TOY, "--precision", "fp32", "--steps", "4", "--out", str(out), *extra)


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def a_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert _train(out, "--ckpt-every", "2", "--log-every", "1")[0] == 0
    return out


@pytest.mark.parametrize("keep", ["all", "metrics.jsonl", "checkpoints", "run.json"])
def test_out_that_holds_a_run_is_refused_and_left_as_it_was(a_run, tmp_path, keep):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(a_run, out)
    for part in ("metrics.jsonl", "checkpoints", "run.json"):
        if keep not in ("all", part):
            shutil.rmtree(out / part) if (out / part).is_dir() else (out / part).unlink()
    before = _hashes(out)
    rc, err = _train(out, "--steps", "6")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "already holds a run" in lines[0] and "--resume" in lines[0] and "fresh --out" in lines[0]
    assert _hashes(out) == before


def test_folder_without_a_run_trains(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "checkpoints").mkdir()  # empty: a requeued job that never saved
    assert _train(tmp_path)[0] == 0
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "run.json").is_file()


def test_resume_where_no_checkpoint_loads_stops_and_touches_nothing(a_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(a_run, out)
    for ckpt in (out / "checkpoints").glob("step-*.pt"):
        ckpt.write_bytes(b"torn")
    before = _hashes(out)
    rc, err = _train(out, "--resume", "--steps", "6")
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert "none of the checkpoints in" in lines[0] and "corrupt or truncated" in lines[0]
    assert _hashes(out) == before


def test_resume_into_an_empty_folder_starts_fresh(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert _train(tmp_path, "--resume")[0] == 0
    assert (tmp_path / "checkpoints" / "step-00000004.pt").is_file()


def test_resume_continues_the_run_and_rewrites_its_record(a_run, tmp_path):
    import json
    import shutil

    out = tmp_path / "run"
    shutil.copytree(a_run, out)
    assert _train(out, "--resume", "--steps", "6")[0] == 0
    rec = json.loads((out / "run.json").read_text())
    assert rec["start_step"] == 4 and rec["steps"] == 6


def test_nproc_refuses_before_starting_torchrun(a_run):
    before = _hashes(a_run)
    rc, err = _train(a_run, "--nproc", "2")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "already holds a run" in err
    assert _hashes(a_run) == before


@pytest.mark.parametrize("steps", ["4", "3"])
def test_resume_with_nothing_to_train_stops_and_touches_nothing(a_run, steps):
    """A run at step 4 resumed with --steps 4 (or fewer): one line, exit 2, run.json and metrics as they were
    (a rewritten record would say steps: 3 of a run that took 4)."""
    before = _hashes(a_run)
    rc, err = _train(a_run, "--resume", "--steps", steps)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0] == (f"ampkit train: error: --resume: the run in {a_run} is already at step 4 "
                        f"({a_run / 'checkpoints' / 'step-00000004.pt'}) and --steps {steps} asks for no step past "
                        "it: give --steps above 4 to train on; nothing was changed")
    assert _hashes(a_run) == before
