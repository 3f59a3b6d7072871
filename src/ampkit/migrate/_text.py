"""Scans of a file's text that need no parse: ``X as Y`` pairs and the quotes of string literals."""

from __future__ import annotations

import re
import string

__all__ = ["as_pairs", "quote_counts", "is_word_char", "STAR_IMPORT"]

# `from x import *` (literal first: a fast search over megabytes)
STAR_IMPORT = re.compile(r"import\s*\*")

_AS_TAIL = re.compile(r"as\s+([A-Za-z_]\w*)")
_STARTS = frozenset(string.ascii_letters + "_")
# A comment or a string literal (its prefix letters, if any, sit just before the match).
_LITERAL = re.compile(r"#[^\n]*|'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"",
                      re.DOTALL)
_PREFIX = frozenset("rRbBuUfFtT")


def is_word_char(c: str, dotted: bool = False) -> bool:
    """A character of an identifier (``\\w``), or a dot when ``dotted``."""
    return c.isalnum() or c == "_" or (dotted and c == ".")


def as_pairs(text: str, *, dotted: bool = False) -> list[tuple[str, str]]:
    """``(X, Y)`` for every ``X as Y`` in ``text`` (imports, ``with``, ``except``, prose alike): what
    ``re.findall(r"([A-Za-z_]\\w*)\\s+as\\s+([A-Za-z_]\\w*)", text)`` finds, and a little more; ``dotted``
    lets ``X`` be dotted (``torch.cuda.amp as amp``). A literal search for ``as``, so fast on megabytes."""
    out = []
    search, pos = _AS_TAIL.search, 0
    while (m := search(text, pos)) is not None:
        j = i = m.start()
        pos = m.end()
        while j > 0 and text[j - 1].isspace():
            j -= 1
        if j == i:
            pos = i + 1  # `pandas as pd`: the "as" of "pandas" is no keyword, the next may be
            continue
        k = j
        while k > 0 and is_word_char(text[k - 1], dotted):
            k -= 1
        while k < j and text[k] not in _STARTS:
            k += 1
        if k < j:
            out.append((text[k:j], m.group(1)))
    return out


def quote_counts(text: str) -> tuple[int, int]:
    """How many plain (non-f, non-triple-quoted) string literals in ``text`` use ``"`` and ``'``, those in an
    f-string's ``{expressions}`` too: what :attr:`ampkit.migrate.context.Context.quote` counts on libcst's
    tree. ``text`` starts at a statement."""
    double = single = 0
    for m in _LITERAL.finditer(text):
        literal = m.group()
        if literal[0] == "#":
            continue
        i = k = m.start()
        while k > max(0, i - 2) and text[k - 1] in _PREFIX:
            k -= 1
        prefix = text[k:i]
        if prefix and k > 0 and is_word_char(text[k - 1], False):
            prefix = ""  # `if"x"`: the letters end a word, they are no prefix
        if "t" in prefix.lower():
            continue
        if "f" in prefix.lower():  # not counted itself; the strings in its {expressions} are
            inner = _in_fstring(literal[3:-3] if literal[:3] in ("\'\'\'", '"""') else literal[1:-1])
            double, single = double + inner[0], single + inner[1]
            continue
        if literal[:3] in ("'''", '"""'):
            continue
        if literal[0] == '"':
            double += 1
        else:
            single += 1
    return double, single


def _in_fstring(body: str) -> tuple[int, int]:
    """:func:`quote_counts` of the ``{expressions}`` of an f-string's body (libcst parses those)."""
    double = single = 0
    i, n = 0, len(body)
    while i < n:
        if body[i] != "{":
            i += 1
            continue
        if body.startswith("{{", i):
            i += 2
            continue
        j, depth = i + 1, 1
        while j < n and depth:
            c = body[j]
            if c in "'\"":
                m = _LITERAL.match(body, j)
                j = m.end() if m else j + 1
                continue
            depth += (c == "{") - (c == "}")
            j += 1
        d, s = quote_counts(body[i + 1: j - 1])
        double, single = double + d, single + s
        i = j
    return double, single
