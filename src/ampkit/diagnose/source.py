"""Reading the user's own source at a line a run observed, so that a fix can quote it.

The run tells where something happened (a frame's file and line); these helpers read what the code
says there: the text of the line, and the expression a call passed for a keyword (``enabled=is_bf16``).
They never guess from patterns elsewhere in the file: a statement that cannot be parsed gives None.
"""

from __future__ import annotations

import ast
import io
import linecache
import tokenize

__all__ = ["line_text", "keyword_source"]

_MAX_LINES = 12


def line_text(filename: str, lineno: int) -> str:
    """The code of one line, stripped, without its trailing comment ('' when unreadable)."""
    text = linecache.getline(filename, lineno).strip()
    try:
        comment = next((t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT), None)
    except (tokenize.TokenError, SyntaxError):  # a line inside a bracket: keep it whole
        return text
    return text[:comment.start[1]].rstrip() if comment is not None else text


def _statement(filename: str, lineno: int) -> tuple[ast.AST, int] | None:
    """The statement that holds ``lineno`` (it may start a few lines above and span several), parsed, with
    the file line its first line is; None if it cannot be parsed."""
    for first in range(lineno, max(0, lineno - _MAX_LINES), -1):
        lines: list[str] = []
        for n in range(first, first + _MAX_LINES):
            text = linecache.getline(filename, n)
            if not text:
                break
            lines.append(text)
            if n < lineno:
                continue
            try:  # continuation lines sit inside brackets, where indentation does not count
                tree = ast.parse("".join(lines).strip())
            except SyntaxError:
                continue
            if len(tree.body) == 1:
                return tree, first
            break
    return None


def keyword_source(filename: str, lineno: int, callee: str, keyword: str, position: int | None = None) -> str | None:
    """The source of the argument passed as ``keyword`` (or at ``position``) to a call of a function named
    ``callee`` (its last dotted part) in the statement at ``filename:lineno``; None when there is none."""
    found = _statement(filename, lineno)
    if found is None:
        return None
    tree, first = found
    at = lineno - first + 1  # the line inside the parsed text
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.lineno <= at <= (node.end_lineno or node.lineno):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name != callee:
            continue
        for kw in node.keywords:
            if kw.arg == keyword:
                return ast.unparse(kw.value)
        if position is not None and len(node.args) > position:
            return ast.unparse(node.args[position])
    return None
