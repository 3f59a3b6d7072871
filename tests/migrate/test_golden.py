"""Golden tests: every ``fixtures/**/NAME.in.py`` migrates to ``NAME.out.py`` with the findings in
``NAME.findings.txt`` (``line:code`` per line).

A first line ``# ampkit-migrate: --target musa`` (or ``--select CODES``, ``--musa-version 2.0``) sets the
options.
Regenerate after an intended change with ``UPDATE_GOLDEN=1 python -m pytest tests/migrate`` and
review the diff of the goldens.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

import libcst as cst
import pytest

from ampkit.migrate import CODES, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(FIXTURES.glob("**/*.in.py"))
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
_DIRECTIVE = "# ampkit-migrate:"


def options(source: str) -> dict:
    """The migrate options a fixture asks for on its first line."""
    first = source.splitlines()[0] if source else ""
    if not first.startswith(_DIRECTIVE):
        return {}
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="agnostic")
    parser.add_argument("--select", default=None)
    parser.add_argument("--musa-version", default=None)
    ns = parser.parse_args(shlex.split(first[len(_DIRECTIVE):]))
    return {"target": ns.target, "select": ns.select.split(",") if ns.select else None,
            "musa_version": ns.musa_version}


def findings_text(findings) -> str:
    return "".join(f"{f.line}:{f.code}\n" for f in findings)


def _sibling(case: Path, suffix: str) -> Path:
    return case.with_name(case.name[: -len(".in.py")] + suffix)


def test_fixtures_exist():
    assert len(CASES) >= 15, "the golden fixtures went missing"


@pytest.mark.parametrize("case", CASES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_golden(case: Path):
    source = case.read_text(encoding="utf-8")
    opts = options(source)
    result = migrate_source(source, filename=case.name, **opts)
    out_path, findings_path = _sibling(case, ".out.py"), _sibling(case, ".findings.txt")
    if UPDATE:
        out_path.write_text(result.new_code, encoding="utf-8")
        findings_path.write_text(findings_text(result.findings), encoding="utf-8")
    assert result.new_code == out_path.read_text(encoding="utf-8"), f"rewrite differs from {out_path.name}"
    assert findings_text(result.findings) == findings_path.read_text(encoding="utf-8")
    assert result.changed == (result.new_code != source)

    # The output always parses, and a second run changes nothing.
    compile(result.new_code, str(out_path), "exec")
    cst.parse_module(result.new_code)
    again = migrate_source(result.new_code, filename=case.name, **opts)
    assert again.new_code == result.new_code, "not idempotent"
    assert not any(f.rewritten for f in again.findings), "a rewritten finding came back"

    for f in result.findings:  # every finding says what, where and how to fix it
        assert f.code in CODES
        assert f.message and f.fix and f.path == case.name and 1 <= f.line <= source.count("\n") + 1




def test_every_code_has_a_fixture():
    seen = {line.split(":", 1)[1].strip() for p in FIXTURES.glob("**/*.findings.txt")
            for line in p.read_text().splitlines() if line}
    assert set(CODES) <= seen
