"""Accounts for every ``cuda`` (and ``nccl``) left in a file that ``ampkit migrate --target musa --fix``
ported: each mention must be either reported by migrate (a finding, or a ``could not port (kind)``
summary line, naming its line) or sit where it does no harm on a MUSA machine.

Harmless places: a comment; a docstring or other string statement; prose in a string (help text, a
message: it has a space); an argparse flag (``"--cuda"``); a name the script chose (``use_cuda``,
``args.cuda``, ``cuda_kwargs``: not torch's); code in a version/feature fallback (under a test of the
torch version or ``hasattr(torch...)``, or in ``except AttributeError/ImportError``), which migrate
documents it leaves alone; and a vendor dispatcher that names musa as well (``if d == "cuda" ... elif d
== "musa"``), which it leaves alone too. Everything else is torch's CUDA API or a device string
(``torch.cuda.X``, ``torch.backends.cuda``, ``torch.version.cuda``, ``.cuda()``, ``.is_cuda``, ``"cuda"``,
``"cuda:0"``, ``f"cuda:{i}"``, ``"nccl"``, ``"CUDA_VISIBLE_DEVICES"``, an import from ``torch.cuda``):
left unreported, it is a port that failed silently.

The checker is independent of migrate's code: it tokenizes and parses the ported file itself, and every
regex match of cuda/nccl must fall in a span it classified, so nothing slips past unclassified.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from dataclasses import dataclass

__all__ = ["Mention", "account", "unaccounted", "reported_lines", "render"]

WORD = re.compile(r"cuda|nccl", re.IGNORECASE)
_DEVICE = re.compile(r"(cuda|nccl)(:.*)?", re.IGNORECASE)
_FLAG = re.compile(r"--?[\w-]*cuda[\w-]*", re.IGNORECASE)
_VERSION_TEST = re.compile(r"__version__|TORCH_\w*|version|hasattr\(\s*torch", re.IGNORECASE)
_FALLBACK_ERRORS = {"AttributeError", "ImportError", "ModuleNotFoundError", "TypeError", "NameError"}
HARMLESS = {"comment", "docstring", "prose", "argparse flag", "user name"}
# `path:LINE: code ...` (a finding) and `could not port (kind): N in F file(s): path:L, path:L, ...`.
_FINDING = re.compile(r"^(?P<path>\S+?):(?P<line>\d+): [a-z][a-z0-9-]+ ", re.MULTILINE)
_SUMMARY = re.compile(r"^could not port \((?P<kind>[^)]*)\): .*?: (?P<places>.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Mention:
    """One cuda/nccl in the ported file. ``accounted`` says why it may stay; None: it may not."""

    line: int
    col: int
    kind: str  # comment, docstring, prose, argparse flag, user name, torch api, device string, ...
    text: str
    accounted: str | None

    def __str__(self) -> str:
        why = self.accounted or "NOT ACCOUNTED FOR"
        return f"{self.line}:{self.col}: {self.kind}: {self.text.strip()[:90]!r} -> {why}"


def reported_lines(cli_output: str, path: str) -> set[int]:
    """Lines of ``path`` (in the file migrate read) that migrate's CLI output names: finding lines, and the
    places listed on its ``could not port`` summary lines."""
    lines = set()
    for m in _FINDING.finditer(cli_output):
        if m.group("path") == path:
            lines.add(int(m.group("line")))
    for m in _SUMMARY.finditer(cli_output):
        for place in m.group("places").split(", "):
            where, _, line = place.rpartition(":")
            if where == path and line.isdigit():
                lines.add(int(line))
    return lines


def _line_map(original: str, ported: str) -> dict[int, int]:
    """Ported line -> the original line it came from (1-based), from a line diff."""
    a, b = original.splitlines(), ported.splitlines()
    mapping: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        for k in range(j2 - j1):
            mapping[j1 + k + 1] = (i1 + min(k, max(i2 - i1 - 1, 0))) + 1
    return mapping


class _Spans:
    def __init__(self, source: str):
        starts = [0]
        for line in source.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self.starts = starts

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def _torch_names(tree: ast.AST) -> set[str]:
    """Names bound to torch or a part of it: ``torch``, ``th`` (``import torch as th``), ``dist``
    (``import torch.distributed as dist``), ``nn`` (``from torch import nn``)."""
    names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if (a.name == "torch" or a.name.startswith("torch.")) and a.asname:
                    names.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update(a.asname or a.name for a in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def account(ported: str, *, original: str | None = None, reported: set[int] = frozenset()) -> list[Mention]:
    """Every cuda/nccl mention of ``ported``, classified. ``reported``: lines of ``original`` (the file
    before the port) that migrate reported; a mention on such a line is accounted for."""
    lines = ported.splitlines()
    line_of = _line_map(original, ported) if original is not None else {i: i for i in range(1, len(lines) + 2)}
    tree = ast.parse(ported)
    parents = _parents(tree)
    torch_names = _torch_names(tree)
    spans = _Spans(ported)
    found: list[tuple[int, int, int, str, str, ast.AST | None]] = []  # start, end, line, col, kind, node

    def add(start_line, start_col, end_line, end_col, kind, node=None):
        found.append((spans.offset(start_line, start_col), spans.offset(end_line, end_col), start_line, start_col,
                      kind, node))

    # strings and comments, from the tokens
    string_statements = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            string_statements.add((node.value.lineno, node.value.col_offset))
    for tok in tokenize.generate_tokens(io.StringIO(ported).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING) or not WORD.search(tok.string):
            continue
        (sl, sc), (el, ec) = tok.start, tok.end
        if tok.type == tokenize.COMMENT:
            add(sl, sc, el, ec, "comment")
        elif (sl, sc) in string_statements:
            add(sl, sc, el, ec, "docstring")
        else:
            add(sl, sc, el, ec, _string_kind(tok.string), _node_at(tree, sl, sc))
    # names, attributes, imports, keywords, definitions, from the tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and WORD.search(node.attr):
            el, ec = node.end_lineno, node.end_col_offset
            kind = _attribute_kind(node, parents, torch_names)
            add(el, ec - len(node.attr), el, ec, kind, node)
        elif isinstance(node, ast.Name) and WORD.search(node.id):
            add(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, "user name", node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            text = ast.get_source_segment(ported, node) or ""
            if WORD.search(text):
                module = getattr(node, "module", None) or ""
                torch_import = module.startswith("torch") or any(a.name.startswith("torch") for a in node.names)
                add(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                    "torch import" if torch_import else "user name", node)
        elif isinstance(node, ast.keyword) and node.arg and WORD.search(node.arg):
            add(node.lineno, node.col_offset, node.lineno, node.col_offset + len(node.arg), "user name", node)
        elif isinstance(node, ast.arg) and WORD.search(node.arg):
            add(node.lineno, node.col_offset, node.lineno, node.col_offset + len(node.arg), "user name", node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and WORD.search(node.name):
            line = lines[node.lineno - 1]
            col = line.find(node.name)
            add(node.lineno, col, node.lineno, col + len(node.name), "user name", node)

    mentions = []
    covered: list[tuple[int, int]] = []
    for start, end, line, col, kind, node in sorted(found, key=lambda f: f[:2]):
        covered.append((start, end))
        mentions.append(Mention(line, col, kind, lines[line - 1],
                                _why(kind, line, node, parents, line_of, reported, ported)))
    for m in WORD.finditer(ported):  # anything no span covers is a gap in the checker: never silently passed
        if not any(s <= m.start() < e for s, e in covered):
            line = ported.count("\n", 0, m.start()) + 1
            col = m.start() - spans.starts[line - 1]
            mentions.append(Mention(line, col, "unclassified", lines[line - 1],
                                    "reported by migrate" if line_of.get(line) in reported else None))
    return sorted(mentions, key=lambda m: (m.line, m.col))


def _string_kind(token: str) -> str:
    prefix = re.match(r"[A-Za-z]*", token).group(0).lower()
    body = token[len(prefix):]
    quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
    value = body[len(quote):-len(quote)]
    if "f" in prefix:
        value = value.split("{", 1)[0]  # the literal text before the first placeholder names the device
        if _DEVICE.fullmatch(value) or value.lower() in ("cuda:", "nccl"):
            return "device string"
    if _DEVICE.fullmatch(value):
        return "device string"
    if _FLAG.fullmatch(value):
        return "argparse flag"
    if re.search(r"\s", value):
        return "prose"
    return "string"


def _node_at(tree: ast.AST, line: int, col: int) -> ast.AST | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.lineno == line and node.col_offset == col:
            return node
    return None


def _attribute_kind(node: ast.Attribute, parents, torch_names: set[str]) -> str:
    parent = parents.get(node)
    if isinstance(parent, ast.Call) and parent.func is node and node.attr.lower() == "cuda":
        return "torch api"  # x.cuda(...)
    if node.attr.lower() == "is_cuda":
        return "torch api"  # x.is_cuda: False for a musa tensor
    if _root(node) in torch_names:
        return "torch api"  # torch.cuda, torch.backends.cuda, torch.version.cuda, torch.cuda.amp
    return "user name"  # args.cuda, self.use_cuda


def _why(kind, line, node, parents, line_of, reported, source) -> str | None:
    if line_of.get(line) in reported:
        return "reported by migrate"
    if kind in HARMLESS:
        return kind
    if node is not None and _in_fallback(node, parents, source):
        return "version fallback (migrate leaves it alone)"
    if node is not None and _dispatcher(node, parents, source):
        return "vendor dispatcher that names musa too (migrate leaves it alone)"
    return None


def _in_fallback(node, parents, source) -> bool:
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test and \
                _VERSION_TEST.search(ast.get_source_segment(source, parent.test) or ""):
            return True
        if isinstance(parent, ast.ExceptHandler) and parent.type is not None:
            names = {n.id for n in ast.walk(parent.type) if isinstance(n, ast.Name)}
            if names & _FALLBACK_ERRORS:
                return True
        child, parent = parent, parents.get(parent)
    return False


def _dispatcher(node, parents, source) -> bool:
    """Inside a conditional that serves both vendors, as migrate's rule sees one: an if/elif chain whose
    tests and direct simple statements name cuda and musa, or a conditional expression, tuple, list, set
    or dict that names both."""
    parent = parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.Module)):
        if isinstance(parent, ast.If):
            parts, branch = [], parent
            while isinstance(branch, ast.If):
                parts.append(branch.test)
                parts.extend(st for st in branch.body if not _compound(st))
                rest = branch.orelse
                branch = rest[0] if len(rest) == 1 and isinstance(rest[0], ast.If) else None
                if branch is None:
                    parts.extend(st for st in rest if not _compound(st))
            text = " ".join(ast.get_source_segment(source, p) or "" for p in parts)
        elif isinstance(parent, (ast.IfExp, ast.Tuple, ast.List, ast.Set, ast.Dict)):
            text = ast.get_source_segment(source, parent) or ""
        else:
            text = ""
        if re.search(r"\bmusa\b", text) and re.search(r"\bcuda\b", text):
            return True
        parent = parents.get(parent)
    return False


def _compound(st: ast.stmt) -> bool:
    return isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef))


def unaccounted(mentions: list[Mention]) -> list[Mention]:
    return [m for m in mentions if m.accounted is None]


def render(mentions: list[Mention], path: str = "") -> str:
    return "\n".join(f"{path}:{m}" for m in mentions)
