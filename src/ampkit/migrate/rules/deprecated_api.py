"""``deprecated-amp-api``: uses of ``torch.{cuda,cpu,musa}.amp`` that no rule rewrote.

Internals (``torch.cuda.amp.common``, ``autocast_mode``), star imports, the API used as a value
rather than called, or an import that also brings names ``torch.amp`` lacks.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate.amp_refs import AmpRef, refs_of
from ampkit.migrate.rules.base import OLD_AMP_KEEP, OLD_AMP_TOKEN, OLD_AMP_WORDS, Rule

__all__ = ["DeprecatedApiRule"]

_FIX = {
    "autocast": 'torch.amp.autocast("{v}", ...)  # or device.type',
    "GradScaler": 'torch.amp.GradScaler("{v}", ...)  # or device.type',
    "custom_fwd": 'torch.amp.custom_fwd(device_type="{v}")',
    "custom_bwd": 'torch.amp.custom_bwd(device_type="{v}")',
}
_PUBLIC = "use the public torch.amp API: torch.amp.autocast, GradScaler, custom_fwd, custom_bwd"


class DeprecatedApiRule(Rule):
    codes = ("deprecated-amp-api",)
    tokens, pattern = OLD_AMP_WORDS, OLD_AMP_TOKEN
    keep = OLD_AMP_KEEP

    def visit_Module(self, node: cst.Module) -> bool:
        refs = refs_of(self.ctx)
        for ref in refs.refs:
            if not ref.rewrite and not ref.fallback:
                self._report_ref(ref)
        for imp in refs.stuck_imports:
            self.report(imp, "deprecated-amp-api",
                        f"`{self.ctx.code(imp).strip()}` imports from a deprecated torch.*.amp namespace and "
                        "was left as is: it imports names torch.amp lacks (or *), or a use of its names "
                        "could not be rewritten (see the findings on those lines).",
                        "import the names you use from torch.amp; " + _PUBLIC)
        return False  # the work is done from the analysis: no need to walk the tree

    def _report_ref(self, ref: AmpRef) -> None:
        old = self.ctx.code(ref.node)
        if ref.api is None:
            why = "it reaches into the deprecated module's internals"
            fix = _PUBLIC
        else:
            fix = _FIX[ref.api].format(v=ref.vendor)
            if ref.style == "ambiguous":
                why = "the name is also bound to another API (a try/except import?), so the call may be new-style"
            elif ref.style == "other":
                why = "it is reached through an import style migrate does not follow"
            elif ref.call is None and not ref.decorator:
                why = "it is used as a value, not called"
            elif ref.binding is not None:
                why = f"the import of `{ref.binding}` also brings names torch.amp lacks, so it stays"
            else:
                why = "its arguments cannot be mapped safely (*args/**kwargs or too many positionals)"
        self.report(ref.node, "deprecated-amp-api",
                    f"`{old}` uses the deprecated torch.{ref.vendor}.amp API and was not rewritten: {why}.", fix)
