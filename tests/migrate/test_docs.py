"""docs/commands/migrate.md documents every code with a before/after example, the exit codes and
the --json schema, so the page cannot drift from the code."""

from __future__ import annotations

import json
import re
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
    assert "**0**" in text and "**1**" in text and "**2**" in text and "skipped" in text


def test_json_schema_matches_the_output(tmp_path, capsys):
    from ampkit.cli import main

    f = tmp_path / "t.py"
    f.write_text("import torch\nckpt = torch.load(p)\n")
    main(["migrate", "--json", str(f)])
    (obj,) = json.loads(capsys.readouterr().out)
    text = DOC.read_text(encoding="utf-8")
    example = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))
    assert set(example[0]) == set(obj)
    assert set(example[0]["findings"][0]) == set(obj["findings"][0])
    for key in obj:
        assert f"| `{key}` |" in text or f"| `{key}[]` |" in text, key
