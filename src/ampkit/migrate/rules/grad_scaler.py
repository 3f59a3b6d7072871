"""``torch.{cuda,musa}.amp.GradScaler(...)`` -> ``torch.amp.GradScaler(<device>, ...)``.

The new signature is the old one with ``device`` in front, so every argument keeps its place.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import expr, prepend_arg
from ampkit.migrate.amp_refs import AmpRef
from ampkit.migrate.device_resolve import devices_of
from ampkit.migrate.rules._amp import amp_refs_for, new_callee, report_fallback
from ampkit.migrate.rules.base import OLD_AMP_KEEP, OLD_AMP_TOKEN, OLD_AMP_WORDS, Rule

__all__ = ["GradScalerRule"]


class GradScalerRule(Rule):
    codes = ("deprecated-amp-api",)
    tokens, pattern = OLD_AMP_WORDS, OLD_AMP_TOKEN
    keep = OLD_AMP_KEEP

    def visit_Module(self, node: cst.Module) -> bool:
        for ref in amp_refs_for(self, "GradScaler"):
            self._rewrite(ref)
        return False  # the work is done from the analysis: no need to walk the tree

    def _rewrite(self, ref: AmpRef) -> None:
        choice = devices_of(self.ctx).resolve(ref.call, ref.vendor)

        def fixer(device: str):
            def fix(updated: cst.Call) -> cst.Call:
                new = updated.with_changes(func=new_callee(ref, updated.func))
                return prepend_arg(new, cst.Arg(expr(device)))
            return fix

        report_fallback(self, ref, choice, self.ctx.code(fixer(choice.code)(ref.call)),
                        self.ctx.code(fixer("device_type")(ref.call)))
        self.replace(ref.call, fixer(choice.code))
