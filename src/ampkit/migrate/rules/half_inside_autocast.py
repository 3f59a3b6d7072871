"""``half-inside-autocast``: ``.half()``, ``.to(torch.float16)`` or ``.to(dtype=torch.float16)``
inside an autocast region.

Autocast already picks FP16 per op where safe and keeps softmax, norms and losses in FP32; a manual
cast forces FP16 where it overflows, and casting parameters breaks the FP32 master weights.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import dotted, last_name
from ampkit.migrate.rules._autocast_region import AutocastRegionRule

__all__ = ["HalfInsideAutocastRule"]

_HALF = ("float16", "half")


def _is_half(node: cst.BaseExpression) -> bool:
    name = dotted(node) or ""
    return "." in name and name.rsplit(".", 1)[1] in _HALF


class HalfInsideAutocastRule(AutocastRegionRule):
    codes = ("half-inside-autocast",)
    tokens = (("autocast",), ("half", "float16"))
    keep = ("autocast", "half", "float16")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.in_autocast or not isinstance(node.func, cst.Attribute):
            return
        name = last_name(node.func)
        cast = (name == "half" and not node.args) or (
            name == "to" and any(_is_half(a.value) for a in node.args if a.keyword is None
                                 or a.keyword.value == "dtype"))
        if cast:
            self.report(node, "half-inside-autocast",
                        f"`{self.ctx.code(node)}` casts to float16 by hand inside autocast, which already "
                        "chooses float16 per op and keeps precision-sensitive ops in float32.",
                        "drop the cast; autocast picks the dtype (use autocast(..., dtype=torch.float16))")
