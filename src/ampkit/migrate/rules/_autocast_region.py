"""Tracks whether the visitor is inside an autocast region: a ``with ...autocast(...)`` block or a
function decorated with ``@...autocast(...)``. Any API spelling counts (old or new)."""

from __future__ import annotations

import libcst as cst

from ampkit.migrate.context import Context
from ampkit.migrate.rules.base import Rule

__all__ = ["AutocastRegionRule", "is_autocast"]


def is_autocast(ctx: Context, node: cst.BaseExpression) -> bool:
    """``torch.autocast(...)``, ``torch.amp.autocast(...)``, ``autocast(...)``, ... (a call)."""
    return isinstance(node, cst.Call) and ctx.callee(node.func) == "autocast"


class AutocastRegionRule(Rule):
    """Base for rules that care about code run under autocast; read ``self.in_autocast``."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._depth = 0
        self._regions: list[bool] = []
        self.file_uses_autocast = False

    @property
    def in_autocast(self) -> bool:
        return self._depth > 0

    def visit_With(self, node: cst.With) -> None:
        region = any(is_autocast(self.ctx, item.item) for item in node.items)
        self._enter(region)

    def leave_With(self, node: cst.With) -> None:
        self._leave()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._enter(any(is_autocast(self.ctx, d.decorator) for d in node.decorators))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._leave()

    def _enter(self, region: bool) -> None:
        self._regions.append(region)
        self._depth += region
        self.file_uses_autocast |= region

    def _leave(self) -> None:
        self._depth -= self._regions.pop()
