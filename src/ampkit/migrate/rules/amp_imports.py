"""``from torch.cuda.amp import X`` -> ``from torch.amp import X``; ``from torch.cuda import amp`` ->
``from torch import amp``; ``import torch.cuda.amp as amp`` -> ``import torch.amp as amp``.

Only imports whose every use the call rules rewrote (decided in :mod:`ampkit.migrate.amp_refs`).
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import expr
from ampkit.migrate.amp_refs import refs_of
from ampkit.migrate.rules.base import OLD_AMP_KEEP, OLD_AMP_TOKEN, OLD_AMP_WORDS, Rule

__all__ = ["AmpImportsRule"]


class AmpImportsRule(Rule):
    codes = ("deprecated-amp-api",)
    tokens, pattern = OLD_AMP_WORDS, OLD_AMP_TOKEN
    keep = OLD_AMP_KEEP

    def visit_Module(self, node: cst.Module) -> bool:
        for imp, module in refs_of(self.ctx).moves.items():
            if isinstance(imp, cst.ImportFrom):
                self.replace(imp, lambda u, m=module: u.with_changes(module=expr(m)))
            else:  # ImportAlias of `import torch.cuda.amp as amp`
                self.replace(imp, lambda u, m=module: u.with_changes(name=expr(m)))
        return False  # the work is done from the analysis: no need to walk the tree
