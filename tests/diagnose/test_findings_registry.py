"""The one finding registry (ampkit.findings): every code diagnose or migrate can emit is in it, with the
right command, and every code in it is emitted by a command; the views of diagnose and migrate read it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ampkit
from ampkit import findings as registry
from ampkit.migrate.rules import RULES

SRC = Path(ampkit.__file__).resolve().parent
DESIGN_CODES = ["nonfinite-forward", "nonfinite-backward", "clip-before-unscale", "fp16-params-with-scaler",
                "fp16-without-scaler", "dtype-unsupported", "scale-collapse", "scaler-not-checkpointed",
                "half-inside-autocast", "host-sync-per-step", "deprecated-amp-api", "unsafe-torch-load",
                "scaler-with-bf16", "bce-under-autocast"]


def _literal_codes(files: list[Path]) -> set[str]:
    """Code strings in the source: ``Finding(code="...")``, ``fix_for("...")``, ``self.report(node, "...")``,
    ``codes = ("...",)``."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name == "Finding":
                    found |= {k.value.value for k in node.keywords
                              if k.arg == "code" and isinstance(k.value, ast.Constant)}
                elif name in ("fix_for", "info", "title_for") and node.args and isinstance(node.args[0], ast.Constant):
                    found.add(node.args[0].value)
                elif name == "report" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    found.add(node.args[1].value)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "codes" for t in node.targets):
                if isinstance(node.value, ast.Tuple):
                    found |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return found


def test_design_codes_are_kept():
    assert set(DESIGN_CODES) <= set(registry.codes())


def test_every_entry_is_complete():
    for code in registry.codes():
        entry = registry.info(code)
        assert entry.code == code
        assert entry.title and entry.why and entry.fix, code
        assert entry.commands and set(entry.commands) <= {"diagnose", "migrate"}, code
    with pytest.raises(KeyError):
        registry.info("no-such-code")


def test_diagnose_source_emits_exactly_its_registry_codes():
    emitted = _literal_codes(sorted((SRC / "diagnose").glob("*.py")))
    assert emitted == set(registry.codes("diagnose")), emitted ^ set(registry.codes("diagnose"))


def test_migrate_rules_emit_exactly_their_registry_codes():
    declared = {c for rule in RULES for c in rule.codes}
    reported = _literal_codes(sorted((SRC / "migrate" / "rules").glob("*.py")))
    assert reported <= declared
    assert declared == set(registry.codes("migrate")), declared ^ set(registry.codes("migrate"))


def test_views_read_the_registry():
    from ampkit.diagnose import findings as dfind
    from ampkit.migrate import CODES as MIGRATE_CODES

    assert list(MIGRATE_CODES) == list(registry.codes("migrate"))
    assert all(MIGRATE_CODES[c] == registry.info(c).title for c in MIGRATE_CODES)
    assert all(dfind.fix_for(c) == registry.info(c).fix and dfind.TITLES[c] == registry.info(c).title
               for c in registry.codes())
