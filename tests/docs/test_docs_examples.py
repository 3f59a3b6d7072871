"""Every ```python example of the docs site and the README runs on the CPU."""

from __future__ import annotations

import sys
import warnings

import pytest

from docs_examples import ROOT, MarkerError, blocks, pages, run_page

PAGES = [p for p in pages() if any(b.skip is None and b.file is None for b in blocks(p))]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh folder, current and first on sys.path, the CPU, and no modules left behind."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AMPKIT_DEVICE", "cpu")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    before = set(sys.modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield tmp_path
    for name in set(sys.modules) - before:
        if str(tmp_path) in str(getattr(sys.modules[name], "__file__", "") or ""):
            del sys.modules[name]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_examples_run(page, sandbox):
    assert run_page(page, sandbox) >= 1


def test_the_pages_have_examples():
    # The pages that document Python code must keep running examples (not all skipped).
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    for required in ("README.md", "docs/getting-started.md", "docs/api/index.md", "docs/api/engine.md",
                     "docs/api/checkpoints.md", "docs/api/tasks.md", "docs/guide/own-task.md"):
        assert required in names, required


def test_a_broken_example_fails(sandbox):
    page = sandbox / "page.md"
    text = "intro\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'wrong'\n```\n"
    with pytest.raises(AssertionError, match=r"page.md:7 failed: AssertionError: wrong"):
        run_page(page, sandbox, text)


def test_markers(sandbox):
    page = sandbox / "page.md"
    text = ("<!-- skip-example: needs a GPU -->\n```python\nraise SystemExit('never runs')\n```\n"
            "<!-- example-file: helper_mod.py -->\n```python\nVALUE = 41\n```\n"
            "```python\nimport helper_mod\nassert helper_mod.VALUE + 1 == 42\n```\n"
            "```bash\nexit 1\n```\n")
    found = blocks(page, text)
    assert [(b.skip, b.file) for b in found] == [("needs a GPU", None), (None, "helper_mod.py"), (None, None)]
    assert run_page(page, sandbox, text) == 1


def test_a_marker_needs_a_reason(sandbox):
    with pytest.raises(MarkerError, match="needs a value"):
        blocks(sandbox / "page.md", "<!-- skip-example: -->\n```python\npass\n```\n")


def test_readme_links_point_at_files_and_it_stays_short():
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 10 * 1024, "the README is an overview (<= 10 KB): move details into docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
