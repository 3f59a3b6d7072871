"""A partial parse: the statements the rules can look at, with the rest of the file set aside.

libcst's parse (and every analysis over its tree) costs far more than Python's own parser, and most
of a training script is code no rule reads: data pipelines, argument parsing, logging. The rules say
what a statement must hold for them to look at it (``Rule.keep``: words, found by plain substring search);
the skeleton keeps those statements, the imports, and the headers of the blocks around them. Each run of other
statements becomes one ``pass`` placeholder on the same first line, followed by filler comments, so
every kept node keeps its line and its text. After the rewrite the placeholders are spliced back
into the original text (:func:`splice`).

What decides a rule's answer must be in the skeleton; besides each rule's own words that is:

* names bound by an import from torch are rebound nowhere else out of sight (qualified names follow
  assignments): any statement that may rebind one is kept, and so are ``global``/``nonlocal`` and the
  imports at module level, from torch, or of such a name;
* names a kept import binds (``from torch.cuda.amp import autocast as ac``: ``ac``) and names bound
  with ``as`` to a word of a rule (``GradScaler as S``) count as the rules' words;
* a block's last statement when it may end the run (``raise``, ``exit``), for a rule that reads it
  (``Rule.reads_block_ends``: host-sync-per-step);
* module-level ``for``/``while`` and ``if __name__ ...``: whether a file is a script depends on them.

Whole-file analysis stays where the skeleton cannot serve: a star import (torch may come through it),
``\\r`` line ends, or text that holds the placeholder marker itself; and :func:`splice` returns None
when the rewritten skeleton lost or moved a placeholder, so the caller parses the whole file instead.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from ampkit.migrate._text import as_pairs, is_word_char

__all__ = ["Skeleton", "build", "splice", "MARK"]

MARK = "ampkit-skeleton"
_PLACEHOLDER = re.compile(rf"^[ \t\f]*pass  # {MARK}:(\d+)\n", re.MULTILINE)
_FILL = f"# {MARK}-fill\n"
_FILL_LINE = re.compile(rf"^# {MARK}-fill\n", re.MULTILINE)
_NEWLINE = re.compile("\n")
# What may end the run as a block's last statement (host-sync-per-step reads it).
_ENDS = ("raise", "exit", "_exit", "quit")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class Skeleton:
    """``text`` is what libcst parses; ``pieces[n]`` the original lines placeholder ``n`` stands for."""

    text: str
    pieces: tuple[str, ...]
    kept_lines: int
    lines: int


class _Lines:
    """Which lines hold a word: plain substring search, then a look at the two ends."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.newlines = [m.start() for m in _NEWLINE.finditer(code)]

    def line_of(self, offset: int) -> int:
        return bisect_left(self.newlines, offset) + 1

    def occurrences(self, word: str):
        """Offsets of ``word`` (a keep word: whole, or open at a ``*`` end) in the text."""
        code = self.code
        text = word.strip("*")
        open_left, open_right = word.startswith("*"), word.endswith("*")
        n = len(text)
        i = code.find(text)
        while i >= 0:
            if (open_left or i == 0 or not is_word_char(code[i - 1])) and \
                    (open_right or i + n >= len(code) or not is_word_char(code[i + n])):
                yield i
            i = code.find(text, i + 1)

    def mark(self, words, marked: bytearray) -> None:
        for word in words:
            for i in self.occurrences(word):
                marked[self.line_of(i)] = 1

    def mark_rebinding(self, names, marked: bytearray) -> None:
        """Lines where a name imported from torch may be bound again (``x = ``, ``as x``, ``def x``, a
        parameter or a loop target): qualified names follow every binding."""
        code = self.code
        for name in names:
            for i in self.occurrences(name):
                j = i + len(name)
                while j < len(code) and code[j] in " \t":
                    j += 1
                nxt = code[j: j + 2]
                before = code[max(0, i - 9): i].split()
                if (nxt[:1] in ("=", ":", ",", ")", "]") and nxt != "==") or \
                        (nxt == "in" and not is_word_char(code[j + 2: j + 3] or " ")) or \
                        (before and before[-1] in ("as", "def", "class", "del")):
                    marked[self.line_of(i)] = 1


def _matches(words, text: str) -> bool:
    lines = _Lines(text)
    return any(next(lines.occurrences(w), None) is not None for w in words)


def _bound_names(tree: ast.Module) -> tuple[set[str], list[ast.stmt]]:
    """Local names bound by imports from torch, and every import statement (at any depth)."""
    names: set[str] = set()
    imports: list[ast.stmt] = []
    stack = list(tree.body)
    while stack:
        st = stack.pop()
        if isinstance(st, ast.Import):
            imports.append(st)
            for a in st.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(st, ast.ImportFrom):
            imports.append(st)
            if _from_torch(st):
                names.update(a.asname or a.name for a in st.names)
        else:
            for block, _ in _blocks(st, None):
                stack.extend(block)
    names.discard("*")
    return names, imports


def _from_torch(st: ast.ImportFrom) -> bool:
    return not st.level and bool(st.module) and (st.module == "torch" or st.module.startswith("torch."))


def _locals(st: ast.stmt) -> list[str]:
    if isinstance(st, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in st.names]
    return [a.asname or a.name for a in st.names]


class _Builder:
    def __init__(self, lines: list[str], marked: bytearray, ends: bytearray | None,
                 torch_names: set[str]) -> None:
        self.lines = lines
        self.cum = [0, *accumulate(marked[1:])]  # cum[i]: marked lines among 1..i
        self.ends = ends
        self.torch_names = torch_names
        self.drops: list[tuple[int, int]] = []

    def marks(self, start: int, end: int) -> int:
        return self.cum[end] - self.cum[start - 1] if end >= start else 0

    def starts_line(self, st: ast.stmt) -> bool:
        return not self.lines[st.lineno - 1].encode("utf-8")[: st.col_offset].strip()

    def header(self, start: int, end: int) -> int:
        """Marks in a header's lines, without the comments and blank lines before its block."""
        lines = self.lines
        while end > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        return self.marks(start, end)

    def block(self, stmts: list[ast.stmt], top: bool = False) -> bool:
        """Decide a block's statements, recording what gives way; True when any stays."""
        if not stmts:
            return False
        if not self.starts_line(stmts[0]):  # `if x: y` / `else: z`: one line, kept as written
            return True
        units: list[list] = []
        for st in stmts:  # statements that share a line (`a = 1; b = 2`) stand or fall together
            start = _start(st)
            if units and start <= units[-1][1]:
                units[-1][1] = max(units[-1][1], st.end_lineno)
                units[-1][2].append(st)
            else:
                units.append([start, st.end_lineno, [st]])
        keep = []
        for start, end, members in units:
            k = False
            for st in members:
                k |= self.statement(st, top)
            keep.append(k)
        if self.ends is not None and any(keep) and not keep[-1]:
            start, end, members = units[-1]  # `raise` / `sys.exit()` last: the block runs once, not per step
            if not _blocks(members[-1], None) and any(self.ends[start: end + 1]):
                keep[-1] = True
        run = None
        for (start, end, _), k in zip(units, keep):
            if k:
                if run is not None:
                    self.drops.append(run)
                    run = None
            else:
                run = (run[0], end) if run is not None else (start, end)
        if run is not None:
            self.drops.append(run)
        return any(keep)

    def statement(self, st: ast.stmt, top: bool) -> bool:
        start, end = _start(st), st.end_lineno
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            return top or (isinstance(st, ast.ImportFrom) and _from_torch(st)) or \
                any(n in self.torch_names for n in _locals(st)) or self.marks(start, end) > 0
        if isinstance(st, (ast.Global, ast.Nonlocal)):
            return True
        blocks = _blocks(st, self.lines)
        if not blocks:
            return self.marks(start, end) > 0
        mark = len(self.drops)
        kept = False
        for body, elif_ in blocks:
            if elif_:  # `elif`: a clause of this if, not a statement that could give way to a placeholder
                kept |= self.statement(body[0], False)
            else:
                kept |= self.block(body)
        own = sum(self.header(a, b) for a, b in _headers(st))
        if kept or own > 0 or top and (isinstance(st, _LOOPS) or isinstance(st, ast.If) and
                                       "__name__" in self.lines[st.lineno - 1]):
            return True
        del self.drops[mark:]  # the whole statement gives way: nothing inside is set aside on its own
        return False


def _start(st: ast.stmt) -> int:
    decorators = getattr(st, "decorator_list", None)
    return decorators[0].lineno if decorators else st.lineno


def _headers(st: ast.stmt) -> list[tuple[int, int]]:
    """The line ranges of a compound statement's own header(s): the lines before each block."""
    if isinstance(st, ast.Match):
        return [(st.lineno, st.lineno)] + [(c.pattern.lineno, _start(c.body[0]) - 1) for c in st.cases]
    out = [(_start(st), _start(st.body[0]) - 1)]
    for h in getattr(st, "handlers", ()):
        out.append((h.lineno, _start(h.body[0]) - 1))
    return out


def _blocks(st: ast.stmt, lines: list[str] | None) -> list[tuple[list[ast.stmt], bool]]:
    """The statement's blocks in source order; True marks an ``elif`` (a nested If in ``orelse``)."""
    out: list[tuple[list[ast.stmt], bool]] = []
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.AsyncWith)):
        out.append((st.body, False))
    elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
        out += [(st.body, False), (st.orelse, False)]
    elif isinstance(st, ast.If):
        out.append((st.body, False))
        out.append((st.orelse, lines is not None and _is_elif(st, lines)))
    elif isinstance(st, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        out.append((st.body, False))
        out += [(h.body, False) for h in st.handlers]
        out += [(st.orelse, False), (st.finalbody, False)]
    elif isinstance(st, ast.Match):
        out += [(c.body, False) for c in st.cases]
    return [(b, e) for b, e in out if b]


def _is_elif(st: ast.If, lines: list[str]) -> bool:
    orelse = st.orelse
    return len(orelse) == 1 and isinstance(orelse[0], ast.If) and \
        lines[orelse[0].lineno - 1].lstrip().startswith("elif")


def build(code: str, tree: ast.Module, words: list[str], *, block_ends: bool = False,
          most: float = 0.8) -> Skeleton | None:
    """The skeleton of ``code`` (parsed by ``ast`` as ``tree``) for rules that look at statements holding one
    of ``words`` (:attr:`Rule.keep`); ``block_ends``: a rule reads whether a block ends the run. None when it
    would keep more than ``most`` of the lines (parse it all)."""
    if "\r" in code or MARK in code:
        return None
    lines = code.split("\n")
    text = _Lines(code)
    marked = bytearray(len(lines) + 2)
    text.mark(words, marked)
    torch_names, imports = _bound_names(tree)
    torch_names.add("torch")  # the name rules read torch by, imported or not
    bound: set[str] = set()
    for st in imports:  # a name bound by an import from a module the rules name is one of their words
        if any(marked[st.lineno: st.end_lineno + 1]):
            bound.update(a.asname or a.name for a in st.names if a.asname or isinstance(st, ast.ImportFrom))
    # `GradScaler as S`: S is one of the words
    bound.update(alias for original, alias in as_pairs(code, dotted=True) if _matches(words, original))
    bound.discard("*")
    text.mark(sorted(bound), marked)
    text.mark_rebinding(sorted(torch_names), marked)
    ends = None
    if block_ends:
        ends = bytearray(len(lines) + 2)
        text.mark(_ENDS, ends)
    builder = _Builder(lines, marked, ends, torch_names)
    builder.block(tree.body, top=True)
    if not builder.drops:
        return None
    dropped = sum(end - start + 1 for start, end in builder.drops)
    if len(lines) - dropped > most * len(lines):
        return None
    out: list[str] = []
    pieces: list[str] = []
    prev = 0  # lines[:prev] are written
    for start, end in sorted(builder.drops):
        out.extend(line + "\n" for line in lines[prev: start - 1])
        first = lines[start - 1]
        indent = first[: len(first) - len(first.lstrip(" \t\f"))]
        pieces.append("\n".join(lines[start - 1: end]) + ("" if end == len(lines) else "\n"))
        out.append(f"{indent}pass  # {MARK}:{len(pieces) - 1}\n")
        out.extend(_FILL for _ in range(end - start))
        prev = end
    out.extend(line + "\n" for line in lines[prev:])
    skeleton = "".join(out)[:-1]  # one newline per line wrote one too many at the end
    return Skeleton(skeleton, tuple(pieces), len(lines) - dropped, len(lines))


def splice(new_text: str, skeleton: Skeleton) -> str | None:
    """The rewritten skeleton with each placeholder replaced by the original text it stands for; None
    when a placeholder is missing, doubled or moved off its line start (the caller parses it all)."""
    added = not new_text.endswith("\n")  # a file without a final newline: its last line is a line too
    text = _FILL_LINE.sub("", new_text + "\n" if added else new_text)
    seen: list[int] = []

    def put(m: re.Match[str]) -> str:
        n = int(m.group(1))
        seen.append(n)
        piece = skeleton.pieces[n] if n < len(skeleton.pieces) else ""
        return piece if piece.endswith("\n") else piece + "\n"

    out = _PLACEHOLDER.sub(put, text)
    if sorted(seen) != list(range(len(skeleton.pieces))):
        return None
    return out[:-1] if added else out
