"""The second corpus (tests/diagnose/corpus2/): scripts written the way tutorials and public repositories
write them, each with one planted AMP defect marked on its line (`# expect: CODE`) and a clean twin
(`NAME_clean.py`). Each planted defect must be found with its own code at its own line (the op's own
line for non-finite values, forward and backward), and nothing else; every clean twin gives no finding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.diagnose import diagnose_script

CORPUS = Path(__file__).parent / "corpus2"
SCRIPTS = sorted(p.stem for p in CORPUS.glob("*.py"))
MARK = re.compile(r"#\s*expect:\s*([a-z0-9-]+)")
PLANTED = [s for s in SCRIPTS if MARK.search((CORPUS / f"{s}.py").read_text())]
NOTHING_TO_CHECK = ["never_trains"]
CLEAN = [s for s in SCRIPTS if s not in PLANTED and s not in NOTHING_TO_CHECK]  # twins and range_loss_float


def expectations(name: str) -> list[tuple[str, str]]:
    """``(code, "NAME.py:LINE")`` for every marker in the script."""
    lines = (CORPUS / f"{name}.py").read_text().splitlines()
    return [(m[1], f"{name}.py:{i}") for i, text in enumerate(lines, 1) if (m := MARK.search(text))]


def line_of(where: str) -> str:
    """The ``file:line`` a finding points at: after the module path (``model.attn · x.py:29``) when there is one."""
    found = re.search(r"([\w./-]+\.py:\d+)", where.split(" · ", 1)[-1])
    return found[1] if found else where


def test_corpus2_pairs_every_planted_script_with_a_clean_twin():
    assert len(PLANTED) >= 10
    for name in PLANTED:
        assert f"{name}_clean" in CLEAN, name
        text = (CORPUS / f"{name}.py").read_text()
        assert 30 <= len(text.splitlines()) <= 80, name
    for name in CLEAN + PLANTED:
        assert 25 <= len((CORPUS / f"{name}.py").read_text().splitlines()) <= 80, name


@pytest.mark.parametrize("name", PLANTED)
def test_planted_defect_found_with_its_code_at_its_line(name, monkeypatch):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script(f"{name}.py")
    got = [(f.code, line_of(f.where)) for f in result.findings]
    assert got == expectations(name), [f.to_dict() for f in result.findings]
    assert all(f.fix and f.message for f in result.findings)


@pytest.mark.parametrize("name", CLEAN)
def test_clean_twin_has_no_finding(name, monkeypatch):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script(f"{name}.py")
    assert result.findings == () and result.checked and result.error is None, result.findings


def test_script_that_never_trains_says_nothing_was_checked(monkeypatch, capsys):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script("never_trains.py")
    assert result.findings == () and not result.checked and result.steps == 0
    assert main(["diagnose", "never_trains.py"]) == 3
    out = capsys.readouterr().out
    assert "nothing was checked" in out and "no findings" not in out
    assert main(["diagnose", "layernorm_eps_fp16_clean.py"]) == 0  # a checked clean run still exits 0
