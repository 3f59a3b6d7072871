"""The API reference renders: no Sphinx role printed literally, no ``>>>`` read as nested quotes, and the docs
build quiet (no third-party banners, nothing missing from the ``docs`` extra)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip('the docs toolchain is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_MKDOCS_2_WARNING", "DISABLE_MKDOCS_2_WARNING")}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout + proc.stderr


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
