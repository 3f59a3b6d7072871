"""``torch.{cuda,cpu,musa}.amp.autocast(...)`` -> ``torch.amp.autocast(<device>, ...)``.

Call, context manager and decorator are all calls. The old positional order was
``(enabled, dtype, cache_enabled)``; the new one starts with ``(device_type, dtype, ...)``, so
positional arguments become keywords. The old default dtype is written out where the new
default may differ (a device variable, or a device other than the old vendor).
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import append_arg, expr, keyword_arg, kwarg, prepend_arg
from ampkit.migrate.amp_refs import AmpRef
from ampkit.migrate.device_resolve import NEW_DEFAULT_DTYPE, OLD_DEFAULT_DTYPE, DeviceChoice, devices_of
from ampkit.migrate.rules._amp import amp_refs_for, new_callee, report_fallback
from ampkit.migrate.rules.base import OLD_AMP_KEEP, OLD_AMP_TOKEN, OLD_AMP_WORDS, Rule

__all__ = ["AutocastRule"]

_OLD_POSITIONAL = ("enabled", "dtype", "cache_enabled")


class AutocastRule(Rule):
    codes = ("deprecated-amp-api",)
    tokens, pattern = OLD_AMP_WORDS, OLD_AMP_TOKEN
    keep = OLD_AMP_KEEP

    def visit_Module(self, node: cst.Module) -> bool:
        for ref in amp_refs_for(self, "autocast"):
            self._rewrite(ref)
        return False  # the work is done from the analysis: no need to walk the tree

    def _rewrite(self, ref: AmpRef) -> None:
        call = ref.call
        positional = sum(1 for a in call.args if a.keyword is None)
        has_dtype = positional >= 2 or kwarg(call, "dtype") is not None
        choice = devices_of(self.ctx).resolve(call, ref.vendor)
        old_dtype = OLD_DEFAULT_DTYPE[ref.vendor]
        need_dtype = not has_dtype and NEW_DEFAULT_DTYPE.get(choice.literal) != old_dtype
        torch = self.ctx.torch_name
        if need_dtype and torch is None:  # cannot name torch.float16 here: keep the old vendor
            device = self.ctx.retarget(ref.vendor)
            choice = DeviceChoice(self.ctx.literal(device), device, self.ctx.target == "agnostic",
                                  "torch is not imported as a module, so the dtype cannot be written")
            need_dtype = False

        def fixer(device: str, dtype: bool):
            def fix(updated: cst.Call) -> cst.Call:
                args, index = [], 0
                for arg in updated.args:
                    if arg.keyword is None:
                        arg = keyword_arg(_OLD_POSITIONAL[index], arg.value).with_changes(
                            comma=arg.comma, whitespace_after_arg=arg.whitespace_after_arg)
                        index += 1
                    args.append(arg)
                new = updated.with_changes(func=new_callee(ref, updated.func), args=args)
                new = prepend_arg(new, cst.Arg(expr(device)))
                if dtype:
                    new = append_arg(new, keyword_arg("dtype", expr(f"{torch or 'torch'}.{old_dtype}")))
                return new
            return fix

        # Passed a device variable, the call must keep the old API's dtype: the new default differs per device.
        report_fallback(self, ref, choice, self.ctx.code(fixer(choice.code, need_dtype)(call)),
                        self.ctx.code(fixer("device_type", not has_dtype)(call)))
        self.replace(call, fixer(choice.code, need_dtype))
