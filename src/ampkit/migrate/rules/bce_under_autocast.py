"""``bce-under-autocast``: ``binary_cross_entropy`` inside an autocast region, or an ``nn.BCELoss``
in a file that uses autocast.

Autocast refuses ``binary_cross_entropy`` (it is unsafe in FP16: the log of a probability rounded to
0 or 1); ``BCEWithLogitsLoss`` fuses the sigmoid and is autocast-safe. Not rewritten: the sigmoid in
the model has to go too.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate.rules._autocast_region import AutocastRegionRule

__all__ = ["BceUnderAutocastRule"]

_FIX = ("criterion = nn.BCEWithLogitsLoss()  # and return logits: drop the final sigmoid\n"
        "loss = F.binary_cross_entropy_with_logits(logits, target)")


class BceUnderAutocastRule(AutocastRegionRule):
    codes = ("bce-under-autocast",)
    tokens = (("binary_cross_entropy", "BCELoss"), ("autocast",))

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._bce_losses: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.callee(node.func)
        if name == "autocast":
            self.file_uses_autocast = True
        elif name == "binary_cross_entropy" and self.in_autocast:
            self.report(node, "bce-under-autocast",
                        "binary_cross_entropy under autocast raises an error (it is unsafe in float16); "
                        "compute the loss from logits instead.", _FIX)
        elif name == "BCELoss":
            self._bce_losses.append(node)

    def leave_Module(self, node: cst.Module) -> None:
        if not self.file_uses_autocast:
            return
        for call in self._bce_losses:
            self.report(call, "bce-under-autocast",
                        "nn.BCELoss in a file that uses autocast: called under autocast it raises an "
                        "error (binary_cross_entropy is unsafe in float16).", _FIX)
