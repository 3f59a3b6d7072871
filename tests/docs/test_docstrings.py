"""Every public name of ampkit has a docstring with a short example, and the examples that run, pass.

The examples assume `import torch, ampkit` and run on the CPU in a temporary folder.
"""

from __future__ import annotations

import doctest
import inspect

import pytest

import torch

import ampkit

NAMES = [n for n in ampkit.__all__ if n != "__version__"]


@pytest.mark.parametrize("name", NAMES)
def test_public_name_has_docstring_with_example(name):
    doc = inspect.getdoc(getattr(ampkit, name)) or ""
    assert len(doc) >= 40, f"ampkit.{name} needs a docstring"
    assert ">>>" in doc, f"the docstring of ampkit.{name} needs a short example (a >>> line)"


@pytest.mark.parametrize("name", NAMES)
def test_docstring_examples_run(name, monkeypatch, tmp_path):
    monkeypatch.setenv("AMPKIT_DEVICE", "cpu")
    monkeypatch.chdir(tmp_path)
    obj = getattr(ampkit, name)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    # The module's own names, plus the two every example may assume.
    globs = {**vars(inspect.getmodule(obj)), "ampkit": ampkit, "torch": torch}
    for test in finder.find(obj, f"ampkit.{name}", globs=globs):
        runner.run(test)
    assert runner.failures == 0, f"a docstring example of ampkit.{name} failed (run with -s to see it)"


def test_the_api_reference_page_documents_every_public_name():
    # docs/api/reference.md renders each name with mkdocstrings (`::: module.Name`) from its real module.
    from docs_examples import ROOT

    page = (ROOT / "docs" / "api" / "reference.md").read_text(encoding="utf-8")
    for name in NAMES:
        module = getattr(ampkit, name).__module__
        assert f"::: {module}.{name}\n" in page, f"add `::: {module}.{name}` to docs/api/reference.md"


@pytest.mark.parametrize("cls,heading", [("Task", "## `ampkit.Task`"), ("TrainConfig", "## `ampkit.TrainConfig`")])
def test_the_tasks_page_has_a_row_for_every_field(cls, heading):
    # docs/api/tasks.md: one table row per dataclass field, so a new field cannot go undocumented.
    import dataclasses

    from docs_examples import ROOT

    page = (ROOT / "docs" / "api" / "tasks.md").read_text(encoding="utf-8")
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    for f in dataclasses.fields(getattr(ampkit, cls)):
        assert f"| `{f.name}` |" in section, f"ampkit.{cls}.{f.name} has no row in docs/api/tasks.md"
