"""The one-pass walk, the parent map and the start lines agree with libcst's own visit, ParentNodeProvider
and PositionProvider, event for event, on every golden fixture (real code: f-strings with format specs,
decorators, nested defs, comments, CRLF)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ampkit.migrate._lines import start_lines
from ampkit.migrate._walk import parents_of, walk

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("**/*.in.py"))
EXTRA = ('x = f"{a:>{w}.{p}f} {b!r:^10} {c=}"\r\nif x:\r\n    @d(1)\r\n    def f(*, k=2): return {**k}\r\n'
         "from m import (a as b,\n    c)\n")


def _logger() -> type:
    """A visitor with every visit/leave hook (node and attribute) that logs what it sees."""
    ns: dict = {"__init__": lambda self: (cst.CSTVisitor.__init__(self), setattr(self, "log", []))[0]}

    def hook(tag: str):
        return lambda self, node: self.log.append((tag, id(node)))

    for c in vars(cst).values():
        if isinstance(c, type) and issubclass(c, cst.CSTNode) and dataclasses.is_dataclass(c):
            for kind in ("visit", "leave"):
                ns[f"{kind}_{c.__name__}"] = hook(f"{kind} {c.__name__}")
                for f in dataclasses.fields(c):
                    ns[f"{kind}_{c.__name__}_{f.name}"] = hook(f"{kind} {c.__name__}.{f.name}")
    return type("Logger", (cst.CSTVisitor,), ns)


LOGGER = _logger()


@pytest.mark.parametrize("source", [p.read_text() for p in FIXTURES[::3]] + [EXTRA])
def test_walk_parents_and_lines_match_libcst(source):
    module = cst.parse_module(source)
    theirs, ours = LOGGER(), LOGGER()
    module.visit(theirs)
    walk(module, [ours])
    assert ours.log == theirs.log
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    assert parents_of(module) == dict(wrapper.resolve(ParentNodeProvider))
    positions = wrapper.resolve(PositionProvider)
    assert start_lines(module, source.replace("\r", "")) == {n: r.start.line for n, r in positions.items()}


def test_a_visit_returning_false_skips_only_that_visitor():
    class Skip(cst.CSTVisitor):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def visit_Call(self, node):
            return False

        def visit_Name(self, node):
            self.names.append(node.value)

    class All(Skip):
        def visit_Call(self, node):
            return None

    module = cst.parse_module("f(x)\ny\n")
    skip, every = Skip(), All()
    walk(module, [skip, every])
    assert skip.names == ["y"] and every.names == ["f", "x", "y"]


@pytest.mark.parametrize("source", [p.read_text() for p in FIXTURES[1::3]] + [EXTRA])
def test_a_walk_enters_trivia_only_for_a_visitor_that_hooks_them(source):
    """Whitespace, comments and operators are left out unless hooked: the events a Name/Modulo/Comment
    visitor sees are libcst's, and a Name-only walk notes no parent for a whitespace node."""
    module = cst.parse_module(source)
    kinds = ("Name", "Modulo", "Comment", "Call")
    ns = {f"{k}_{c}": (lambda tag: lambda self, node: self.log.append((tag, id(node))))(f"{k} {c}")
          for c in kinds for k in ("visit", "leave")}
    ns["__init__"] = lambda self: (cst.CSTVisitor.__init__(self), setattr(self, "log", []))[0]
    some = type("Some", (cst.CSTVisitor,), ns)
    theirs, ours = some(), some()
    module.visit(theirs)
    walk(module, [ours])
    assert ours.log == theirs.log
    names_only = type("Names", (cst.CSTVisitor,), {"visit_Name": lambda self, node: None})()
    noted: dict = {}
    walk(module, [names_only], noted)
    assert not any(isinstance(n, (cst.SimpleWhitespace, cst.Comma, cst.Comment)) for n in noted)
    assert all(noted[n] is p for n, p in parents_of(module).items() if n in noted)
