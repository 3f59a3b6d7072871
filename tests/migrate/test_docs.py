"""The migrate page of the docs (docs/commands/migrate.md) documents every code with a before/after example."""

from __future__ import annotations

from pathlib import Path

from ampkit.migrate import CODES

DOC = Path(__file__).resolve().parents[2] / "docs" / "commands" / "migrate.md"


def test_every_code_is_documented_with_an_example():
    text = DOC.read_text(encoding="utf-8")
    for code in CODES:
        heading = f"**`{code}`**"
        assert heading in text, code
        section = text.split(heading, 1)[1].split("**`", 1)[0]
        assert "# before" in section and "# after" in section, code


def test_exit_codes_documented():
    text = DOC.read_text(encoding="utf-8")
    assert "**0**" in text and "**1**" in text and "**2**" in text
