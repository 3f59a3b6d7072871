"""The API reference renders: no Sphinx role printed literally, no ``>>>`` read as nested quotes, and the docs
build quiet (no third-party banners, nothing missing from the ``docs`` extra)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
# The docs toolchain is the `docs` extra: CI installs it after the fast run, before `pytest -m slow`.
pytest.importorskip("griffe", reason="needs the docs extra: pip install -e '.[docs]'")
from griffe_sphinx import convert_roles, fence_doctests  # noqa: E402

LITERAL_ROLE = re.compile(r":(?:class|meth|mod|func|attr|exc|data|obj):(?:`|<code>)")  # Markdown made ` into <code>


def test_roles_become_inline_code():
    assert convert_roles("see :class:`~ampkit.device.policy.Precision` and :meth:`ampkit.MixedPrecision.step`") \
        == "see `Precision` and `ampkit.MixedPrecision.step`"
    assert convert_roles(":func:`the trainer <ampkit.training.trainer.train>`") == "`the trainer`"


def test_bare_doctest_is_fenced_and_sections_are_left_alone():
    doc = "Intro.\n\n>>> x = 1\n>>> x\n1\n\nExamples:\n    >>> y = 2\n"
    out = fence_doctests(doc)
    assert "```pycon\n>>> x = 1\n>>> x\n1\n```" in out
    assert "Examples:\n    >>> y = 2" in out  # griffe renders a Google section as code itself


@pytest.mark.slow  # builds the site: 22 s on the busy 2-core machine
def test_rendered_reference_has_no_literal_role_or_quoted_prompt(site):
    out, _ = site
    page = (out / "api" / "reference" / "index.html").read_text(encoding="utf-8")
    assert "MixedPrecision" in page
    found = sorted(set(LITERAL_ROLE.findall(page)))
    assert not found, f"Sphinx roles printed literally in the API reference: {found}"
    assert "<blockquote>\n<blockquote>" not in page and "<blockquote><blockquote>" not in page


@pytest.mark.slow
def test_docs_build_is_quiet(site):
    _, log = site
    for noise in ("ProperDocs", "end of life", "requires either Black or Ruff"):
        assert noise not in log, f"the docs build printed {noise!r}:\n{log[-2000:]}"


def _section(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    return page[start:page.index('class="doc doc-heading"', start + len(anchor) + 10)]


@pytest.mark.slow
def test_classes_show_their_signature_and_nest_under_the_sections(site):
    out, _ = site
    page = (out / "api" / "reference" / "index.html").read_text(encoding="utf-8")
    section = _section(page, "ampkit.engine.core.MixedPrecision")
    signature = re.search(r'<div class="doc-signature[^"]*"><pre>(.*?)</pre>', section, re.S)
    assert signature, "the API reference shows no signature for MixedPrecision"
    text = re.sub(r"<[^>]+>", "", signature.group(1))
    assert re.search(r"MixedPrecision\(\s*precision: .*\*,\s*config: ", text, re.S), text
    # the objects are headings below the page's own sections (h2), so the table of contents nests them
    assert '<h2 id="engine-and-precision"' in page
    assert '<h3 id="ampkit.engine.core.MixedPrecision"' in page
