"""``bce-under-autocast``: ``binary_cross_entropy`` inside an autocast region, or an ``nn.BCELoss``
in a file that uses autocast (``autocast(enabled=False)`` is not a use: code under it runs in FP32,
as YOLOX's BCE matching cost does). A loss bound to a local name whose every call in that function is
outside autocast is not reported (DeepLearningExamples' DLRM evaluates after the block).

Autocast refuses ``binary_cross_entropy`` (it is unsafe in FP16: the log of a probability rounded to
0 or 1); ``BCEWithLogitsLoss`` fuses the sigmoid and is autocast-safe. Not rewritten: the sigmoid in
the model has to go too.
"""

from __future__ import annotations

import re

import libcst as cst

from ampkit.migrate._walk import walk
from ampkit.migrate.rules._autocast_region import AutocastRegionRule, is_disabled

__all__ = ["BceUnderAutocastRule"]

_FIX = ("criterion = nn.BCEWithLogitsLoss()  # and return logits: drop the final sigmoid\n"
        "loss = F.binary_cross_entropy_with_logits(logits, target)")


class BceUnderAutocastRule(AutocastRegionRule):
    codes = ("bce-under-autocast",)
    tokens = (("binary_cross_entropy", "BCELoss"), ("autocast",))
    keep = ("binary_cross_entropy*", "*BCELoss*", "autocast")

    @classmethod
    def keep_words(cls, code: str) -> tuple[str, ...]:
        # `loss_fn = nn.BCELoss()`: every use of loss_fn decides whether it is reported
        return tuple(re.findall(r"(\w+)\s*=(?!=)\s*[\w.\s(]*\bBCELoss\b", code))

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._bce_losses: list[tuple[cst.Call, cst.FunctionDef | None]] = []
        self._functions: list[cst.FunctionDef | None] = [None]
        # (function, local name) -> whether each call of that name ran under autocast
        self._calls: dict[tuple[cst.FunctionDef | None, str], list[bool]] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        self._functions.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.pop()
        super().leave_FunctionDef(node)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name):
            self._calls.setdefault((self._functions[-1], node.func.value), []).append(self.in_autocast)
        name = self.ctx.callee(node.func)
        if name == "autocast":
            self.file_uses_autocast |= not is_disabled(node)  # enabled=False: the FP32 way round
        elif name == "binary_cross_entropy" and self.in_autocast:
            self.report(node, "bce-under-autocast",
                        "binary_cross_entropy under autocast raises an error (it is unsafe in float16); "
                        "compute the loss from logits instead.", _FIX)
        elif name == "BCELoss":
            self._bce_losses.append((node, self._functions[-1]))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.file_uses_autocast:
            return
        for call, function in self._bce_losses:
            if function is not None and self._only_called_outside(call, function):
                continue
            self.report(call, "bce-under-autocast",
                        "nn.BCELoss in a file that uses autocast: called under autocast it raises an "
                        "error (binary_cross_entropy is unsafe in float16).", _FIX)

    def _only_called_outside(self, call: cst.Call, function: cst.FunctionDef) -> bool:
        """``loss_fn = nn.BCELoss()`` in a function that calls ``loss_fn(...)`` only outside autocast,
        and hands it nowhere else (returned or passed on, it may be called under autocast there)."""
        parent = self.ctx.parent(call)
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return False
        local = parent.targets[0].target.value
        calls = self._calls.get((function, local), [])
        uses = [0]

        class _Uses(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                uses[0] += node.value == local

        walk(function.body, [_Uses()])
        return bool(calls) and not any(calls) and uses[0] == 1 + len(calls)
