"""``torch.cuda.amp.custom_fwd`` / ``custom_bwd`` -> ``torch.amp.custom_fwd(device_type=...)``.

Used bare (``@custom_fwd``) or called (``@custom_fwd(cast_inputs=torch.float32)``, or
``custom_fwd(fn)``); ``device_type`` is keyword-only in the new API.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import append_arg, expr, keyword_arg, prepend_arg
from ampkit.migrate.amp_refs import AmpRef
from ampkit.migrate.device_resolve import devices_of
from ampkit.migrate.rules._amp import amp_refs_for, new_callee, report_fallback
from ampkit.migrate.rules.base import OLD_AMP_KEEP, OLD_AMP_TOKEN, OLD_AMP_WORDS, Rule

__all__ = ["CustomFwdRule"]


class CustomFwdRule(Rule):
    codes = ("deprecated-amp-api",)
    tokens, pattern = OLD_AMP_WORDS, OLD_AMP_TOKEN
    keep = OLD_AMP_KEEP

    def visit_Module(self, node: cst.Module) -> bool:
        for ref in amp_refs_for(self, "custom_fwd", "custom_bwd"):
            self._rewrite(ref)
        return False  # the work is done from the analysis: no need to walk the tree

    def _rewrite(self, ref: AmpRef) -> None:
        choice = devices_of(self.ctx).resolve(ref.node, ref.vendor)
        device_arg = keyword_arg("device_type", expr(choice.code))
        report_fallback(self, ref, choice, f"torch.amp.{ref.api}(device_type={choice.code})",
                        f"@torch.amp.{ref.api}(device_type=DEVICE_TYPE)  # DEVICE_TYPE: a module-level constant")

        if ref.call is None:  # bare decorator: becomes a call
            def fix_bare(updated: cst.BaseExpression) -> cst.Call:
                return cst.Call(func=new_callee(ref, updated), args=[device_arg])

            self.replace(ref.node, fix_bare)
            return

        def fix(updated: cst.Call) -> cst.Call:
            new = updated.with_changes(func=new_callee(ref, updated.func))
            if any(a.keyword is None for a in new.args):  # custom_fwd(fn): keywords go last
                return append_arg(new, device_arg)
            return prepend_arg(new, device_arg)

        self.replace(ref.call, fix)
