"""A read-only walk of a libcst tree that runs many visitors in one pass, and the parent map.

libcst's own ``node.visit(visitor)`` rebuilds every node it passes (the same code path serves
transformers), which costs about as much as parsing, per visitor. The rules only read the tree, so
:func:`walk` reads each node's children in libcst's visiting order (learnt once per node class from
libcst itself) and calls the visitors' ``visit_X`` / ``visit_X_attr`` / ``leave_X_attr`` / ``leave_X``
hooks with the semantics of :class:`libcst.CSTVisitor`: a ``visit_X`` returning False skips that
visitor's descent into the node (its ``leave_X`` still runs); the other visitors go on. Whitespace,
comments and operator tokens (about half of a tree's nodes, holding only more of the same) are entered only
when some visitor has a hook for one of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from functools import lru_cache

import libcst as cst

__all__ = ["walk", "parents_of", "child_attrs"]

_ORDER: dict[type, tuple[str, ...]] = {}
# The one visiting order that depends on the node: libcst visits an f-string's format spec (last) only
# when there is one (libcst/_nodes/expression.py, FormattedStringExpression._visit_and_replace_children).
_LAST_IF_PRESENT = frozenset({"FormattedStringExpression", "TemplatedStringExpression"})


class _Recorder(cst.CSTVisitor):
    """Records the attribute names libcst visits on one node, without descending."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        return None

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if attribute not in self.attrs:
            self.attrs.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None


def child_attrs(node: cst.CSTNode) -> tuple[str, ...]:
    """The attributes holding ``node``'s children, in the order libcst visits them."""
    cls = type(node)
    order = _ORDER.get(cls)
    if order is None:
        rec = _Recorder()
        node._visit_and_replace_children(rec)  # noqa: SLF001 -- libcst's own visiting order
        if cls.__name__ in _LAST_IF_PRESENT and "format_spec" not in rec.attrs:
            rec.attrs.append("format_spec")  # libcst visits it only when present
        order = _ORDER[cls] = tuple(rec.attrs)
    return order


_NONE = (None, None, None)


def _classes(module) -> frozenset[type]:
    return frozenset(c for c in vars(module).values()
                     if inspect.isclass(c) and issubclass(c, cst.CSTNode) and c.__module__ == module.__name__
                     and not inspect.isabstract(c) and not c.__name__.startswith(("Base", "_")))


def _trivia() -> tuple[frozenset[type], frozenset[str]]:
    """Operator tokens and brackets (they hold only whitespace), and the whitespace and comment nodes."""
    from libcst._nodes import op, whitespace  # noqa: PLC2701 -- the modules that define exactly these

    tokens = _classes(op) | {cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket,
                             cst.LeftCurlyBrace, cst.RightCurlyBrace}
    space = _classes(whitespace)
    return tokens | space, frozenset(c.__name__ for c in space)


_TRIVIA, _SPACE = _trivia()


@lru_cache(maxsize=256)
def _skipped(hooked: frozenset[str]) -> frozenset[type]:
    """The trivia a walk need not enter: none when a visitor hooks whitespace or comments (every token holds
    some), else the tokens no visitor hooks (``visit_Modulo`` enters Modulo)."""
    if hooked & _SPACE:
        return frozenset()
    return frozenset(c for c in _TRIVIA if c.__name__ not in hooked)


def _table(cls: type) -> dict[str, tuple]:
    """Node class name -> (visit, leave, {attribute: (visit_attr, leave_attr)}) as plain functions:
    looked up once per walk, not per node (and not cached: a class may be patched, as tests do)."""
    # Only hooks a visitor defines: libcst's typed no-op stubs (CSTTypedVisitorFunctions) are skipped.
    hooks: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("libcst"):
            continue
        hooks.update((n, f) for n, f in vars(klass).items() if n.startswith(("visit_", "leave_")))
    split: dict[str, dict[str | None, list]] = {}
    for hook, fn in hooks.items():
        kind, name, attr = (hook.split("_", 2) + [None])[:3]
        split.setdefault(name, {}).setdefault(attr, [None, None])[kind == "leave"] = fn
    table = {}
    for name, by_attr in split.items():
        own = by_attr.pop(None, [None, None])
        table[name] = (own[0], own[1], {a: tuple(p) for a, p in by_attr.items()} or None)
    return table


_IS_NODE: dict[type, bool] = {}


def _is_node(value: object) -> bool:
    kind = type(value)
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = isinstance(value, cst.CSTNode)
    return known


def walk(root: cst.CSTNode, visitors: Sequence[cst.CSTVisitor],
         parents: dict[cst.CSTNode, cst.CSTNode] | None = None) -> None:
    """Run ``visitors`` (plain :class:`libcst.CSTVisitor` subclasses) over ``root`` in one pass; ``parents``
    gets child -> parent for every node the walk enters (before its visitors see it)."""
    active = [(v, _table(type(v))) for v in visitors]
    if active:
        _visit(root, active, parents, _skipped(frozenset(name for _, table in active for name in table)))


def _visit(node: cst.CSTNode, active: list, parents: dict | None, skip: frozenset[type]) -> None:
    name = type(node).__name__
    below = []
    hooked = []
    for v, table in active:
        hooks = table.get(name, _NONE)
        fn = hooks[0]
        if fn is None or fn(v, node) is not False:
            below.append((v, table))
            if hooks[2] is not None:
                hooked.append((v, hooks[2]))
    if below:
        for attr in _ORDER.get(type(node)) or child_attrs(node):
            value = getattr(node, attr)
            if value is None and attr == "format_spec":
                continue
            for v, attrs in hooked:
                fn = attrs.get(attr, _NONE)[0]
                if fn is not None:
                    fn(v, node)
            if type(value) is tuple or type(value) is list:
                for child in value:
                    if type(child) not in skip and _is_node(child):
                        if parents is not None:
                            parents[child] = node
                        _visit(child, below, parents, skip)
            elif type(value) not in skip and _is_node(value):
                if parents is not None:
                    parents[value] = node
                _visit(value, below, parents, skip)
            for v, attrs in hooked:
                fn = attrs.get(attr, _NONE)[1]
                if fn is not None:
                    fn(v, node)
    for v, table in active:
        fn = table.get(name, _NONE)[1]
        if fn is not None:
            fn(v, node)


def parents_of(root: cst.CSTNode) -> dict[cst.CSTNode, cst.CSTNode]:
    """Every node under ``root`` -> its parent (what libcst's ParentNodeProvider gives, much cheaper)."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [root]
    pop, push = stack.pop, stack.append
    order = _ORDER
    while stack:
        node = pop()
        attrs = order.get(type(node)) or child_attrs(node)
        for attr in attrs:
            value = getattr(node, attr)
            if type(value) is tuple or type(value) is list:
                for child in value:
                    if _is_node(child):
                        parents[child] = node
                        push(child)
            elif _is_node(value):
                parents[value] = node
                push(value)
    return parents


def nodes(root: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """Every node under ``root`` (any order)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for attr in child_attrs(node):
            value = getattr(node, attr)
            if type(value) is tuple or type(value) is list:
                stack.extend(c for c in value if _is_node(c))
            elif _is_node(value):
                stack.append(value)
