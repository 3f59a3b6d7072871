"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' ``extensions``): the docstrings are
written for ``help()`` and Sphinx; the site renders Markdown. Two conversions, made on the loaded docstrings
(the source stays as it is):

* Sphinx roles, ``:class:`~ampkit.device.policy.Precision```, ``:meth:`...```, ``:mod:``, ``:func:``,
  ``:attr:``, ``:exc:``, ``:data:``, ``:obj:``, become inline code: ``Precision`` (``~`` keeps the last part, as
  in Sphinx), otherwise the full dotted name.
* A bare doctest block (``>>>`` lines at the docstring's own indentation, outside a Google ``Examples:``
  section, which griffe already renders as code) is fenced as ``pycon``, so Markdown does not read ``>>>``
  as three nested quotes.

``tests/docs/test_api_reference.py`` builds the site and fails when a role or a ``>>>`` quote shows up.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|mod|func|attr|exc|data|obj|const|type):`(?P<target>[^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group("target").strip()
    if "<" in target and target.endswith(">"):  # :class:`title <a.b.C>`
        return f"`{target.split('<', 1)[0].strip()}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


def convert_roles(text: str) -> str:
    """Every Sphinx role in ``text`` as inline code."""
    return ROLE.sub(_role, text)


def fence_doctests(text: str) -> str:
    """Bare ``>>>`` blocks (at column 0 of the dedented docstring) as fenced ``pycon`` blocks."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith((" ", "\t")):
                block.append(lines[i])  # the example and its output, up to the next blank line
                i += 1
            out += ["```pycon", *block, "```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class SphinxToMarkdown(griffe.Extension):
    """Rewrites each object's docstring once it is loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        doc = getattr(obj, "docstring", None)
        if doc is not None and doc.value:
            doc.value = fence_doctests(convert_roles(doc.value))
