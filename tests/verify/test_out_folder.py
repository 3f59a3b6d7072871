"""A comparison never replaces or mixes with one already in its folder: an explicit ``--out`` that holds
one is refused (nothing changed), and without ``--out`` each comparison gets its own folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.errors import UsageError
from ampkit.verify.prior import default_out
from ampkit.verify.script_compare import compare_script

TOY_SPEC = str(Path(__file__).resolve().parents[1] / "toy_task.py") + ":make_task"
SCRIPTS = Path(__file__).resolve().parents[1] / "diagnose" / "scripts"


def _cli(*extra):
    return main(["compare", "--task", TOY_SPEC, "--seeds", "1", "--steps", "6", "--no-audit", "--no-graph",
                 "--device", "cpu", "--precision", "bf16", "--json", *extra])


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


def test_an_out_that_holds_a_comparison_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "c"
    assert _cli("--out", str(out)) in (0, 1, 3)  # a verdict, whichever
    before = _digest(out)
    capsys.readouterr()
    assert _cli("--out", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a comparison (compare.json)" in err[0] and "--continue" in err[0]
    assert _digest(out) == before


def test_without_out_each_comparison_gets_its_own_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(3):
        assert _cli() in (0, 1, 3)  # a verdict, whichever
    capsys.readouterr()
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert folders == ["compare", "compare-2", "compare-3"]
    assert all((tmp_path / "runs" / name / "compare.json").exists() for name in folders)
    assert default_out(resume=True) == Path("runs/compare-3")  # --continue adds to the newest
    assert default_out(resume=False) == Path("runs/compare-4")


def test_a_script_comparison_is_refused_over_one_already_there(tmp_path):
    out = tmp_path / "c"
    (out / "runs" / "seed-0").mkdir(parents=True)  # the runs of an earlier SCRIPT comparison
    with pytest.raises(UsageError, match=r"already holds a comparison \(runs/\): give a fresh --out"):
        compare_script(str(SCRIPTS / "lstm_fp16_clean.py"), seeds=1, steps=2, run_audit=False, out=out)
    assert sorted(p.name for p in out.rglob("*")) == ["runs", "seed-0"]
