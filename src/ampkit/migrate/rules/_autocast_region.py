"""Tracks whether the visitor is inside an autocast region: a ``with ...autocast(...)`` block or a
function decorated with ``@...autocast(...)``. Any API spelling counts (old or new). An
``autocast(enabled=False)`` block is the opposite: code in it runs in FP32 even inside a region
(YOLOX computes its BCE matching cost so)."""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import kwarg

from ampkit.migrate.context import Context
from ampkit.migrate.rules.base import Rule

__all__ = ["AutocastRegionRule", "is_autocast", "is_disabled"]


def is_autocast(ctx: Context, node: cst.BaseExpression) -> bool:
    """``torch.autocast(...)``, ``torch.amp.autocast(...)``, ``autocast(...)``, ... (a call)."""
    return isinstance(node, cst.Call) and ctx.callee(node.func) == "autocast"


def is_disabled(node: cst.BaseExpression) -> bool:
    """``autocast(..., enabled=False)``: written False, so the block runs without autocast."""
    arg = kwarg(node, "enabled") if isinstance(node, cst.Call) else None
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "False"


class AutocastRegionRule(Rule):
    """Base for rules that care about code run under autocast; read ``self.in_autocast``."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # one entry per with/def: True (autocast on), False (enabled=False), None (neither)
        self._regions: list[bool | None] = []
        self.file_uses_autocast = False

    @property
    def in_autocast(self) -> bool:
        """The innermost autocast block or decorator around the node turns autocast on."""
        return next((r for r in reversed(self._regions) if r is not None), False)

    def visit_With(self, node: cst.With) -> None:
        calls = [item.item for item in node.items if is_autocast(self.ctx, item.item)]
        self._enter(None if not calls else not all(is_disabled(c) for c in calls))

    def leave_With(self, node: cst.With) -> None:
        self._leave()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        calls = [d.decorator for d in node.decorators if is_autocast(self.ctx, d.decorator)]
        self._enter(None if not calls else not all(is_disabled(c) for c in calls))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._leave()

    def _enter(self, region: bool | None) -> None:
        self._regions.append(region)
        self.file_uses_autocast |= bool(region)

    def _leave(self) -> None:
        self._regions.pop()
