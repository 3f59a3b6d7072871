"""``unsafe-torch-load``: ``torch.load`` without ``weights_only=True``.

A full unpickle runs whatever code the file names; ``weights_only=True`` loads tensors, dicts and
numbers only (the default from torch 2.6, not before). Rewritten when unambiguous: no
``weights_only``, ``pickle_module`` or ``**kwargs`` at the call. Otherwise reported.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import append_arg, dotted, keyword_arg, kwarg
from ampkit.migrate.rules.base import Rule

__all__ = ["UnsafeTorchLoadRule"]


class UnsafeTorchLoadRule(Rule):
    codes = ("unsafe-torch-load",)
    tokens = (("torch",), ("load",))

    def visit_Call(self, node: cst.Call) -> None:
        if "torch.load" not in self.ctx.qnames(node.func):
            return
        given = kwarg(node, "weights_only")
        if given is not None and dotted(given.value) == "True":
            return
        positional = [a for a in node.args if a.keyword is None]
        ambiguous = (given is not None or kwarg(node, "pickle_module") is not None
                     or len(positional) > 2 or any(a.star for a in node.args))
        why = ("weights_only is set to something other than True" if given is not None
               else "pickle_module or **kwargs make weights_only=True unsafe to add blindly" if ambiguous
               else "")
        message = ("torch.load unpickles arbitrary objects: a tampered checkpoint runs code on load. "
                   "Load tensors only with weights_only=True" + (f" ({why})." if why else "."))
        def add(u: cst.Call) -> cst.Call:
            return append_arg(u, keyword_arg("weights_only", cst.Name("True")))

        fix = (self.ctx.code(add(node)) if not ambiguous
               else "state = torch.load(path, map_location=\"cpu\", weights_only=True)")
        self.report(node, "unsafe-torch-load", message, fix, rewritten=not ambiguous)
        if not ambiguous:
            self.replace(node, add)
