"""A read-only walk of a libcst tree that runs many visitors in one pass, and the parent map.

libcst's own ``node.visit(visitor)`` rebuilds every node it passes (the same code path serves
transformers), which costs about as much as parsing, per visitor. The rules only read the tree, so
:func:`walk` reads each node's children in libcst's visiting order (learnt once per node class from
libcst itself) and calls the visitors' ``visit_X`` / ``visit_X_attr`` / ``leave_X_attr`` / ``leave_X``
hooks with the semantics of :class:`libcst.CSTVisitor`: a ``visit_X`` returning False skips that
visitor's descent into the node (its ``leave_X`` still runs); the other visitors go on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


_HOOKS: dict[type, dict[str, str]] = {}


def _hooks(visitor: cst.CSTVisitor) -> dict[str, object]:
    cls = type(visitor)
    names = _HOOKS.get(cls)
    if names is None:
        names = _HOOKS[cls] = {n: n for n in dir(cls) if n.startswith(("visit_", "leave_"))}
    return {n: getattr(visitor, n) for n in names}


def walk(root: cst.CSTNode, visitors: Sequence[cst.CSTVisitor]) -> None:
    """Run ``visitors`` (plain :class:`libcst.CSTVisitor` subclasses) over ``root`` in one pass."""
    active = [(v, _hooks(v)) for v in visitors]
    if active:
        _visit(root, active)


def _visit(node: cst.CSTNode, active: list) -> None:
    name = type(node).__name__
    visit, leave = "visit_" + name, "leave_" + name
    below = []
    for v in active:
        fn = v[1].get(visit)
        if fn is None or fn(node) is not False:
            below.append(v)
    if below:
        for attr in child_attrs(node):
            value = getattr(node, attr)
            if value is None and attr == "format_spec":
                continue
            va, la = f"{visit}_{attr}", f"{leave}_{attr}"
            for v in below:
                fn = v[1].get(va)
                if fn is not None:
                    fn(node)
            if isinstance(value, cst.CSTNode):
                _visit(value, below)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    if isinstance(child, cst.CSTNode):
                        _visit(child, below)
            for v in below:
                fn = v[1].get(la)
                if fn is not None:
                    fn(node)
    for v in active:
        fn = v[1].get(leave)
        if fn is not None:
            fn(node)


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
            if isinstance(value, cst.CSTNode):
                parents[value] = node
                push(value)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    if isinstance(child, cst.CSTNode):
                        parents[child] = node
                        push(child)
    return parents


def nodes(root: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """Every node under ``root`` (any order)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for attr in child_attrs(node):
            value = getattr(node, attr)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(c for c in value if isinstance(c, cst.CSTNode))
