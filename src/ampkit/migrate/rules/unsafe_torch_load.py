"""``unsafe-torch-load``: ``torch.load`` without ``weights_only=True``.

A full unpickle runs whatever code the file names; ``weights_only=True`` loads tensors, dicts and
numbers only (the default from torch 2.6, not before). Static analysis cannot know what a
checkpoint holds: one with a pickled ``nn.Module`` or an ``argparse.Namespace`` stops loading
under ``weights_only=True`` on torch < 2.6. So the call is rewritten only where the loaded value is
provably a state dict (``x.load_state_dict(torch.load(...))``); elsewhere it is reported with the
safe alternatives. An explicit opt-out (``weights_only=False``, or a branch that tests
``weights_only``) is never reversed; ``weights_only=<a variable>`` is the caller's decision and
not reported.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import append_arg, dotted, keyword_arg, kwarg, last_name
from ampkit.migrate.rules.base import Rule

__all__ = ["UnsafeTorchLoadRule"]

_ALTERNATIVES = (
    "# the checkpoint holds other objects (argparse.Namespace, ...)? allow exactly those:\n"
    "torch.serialization.add_safe_globals([argparse.Namespace])\n"
    "# or save model.state_dict() instead of the module, so weights_only=True can load it")


class UnsafeTorchLoadRule(Rule):
    codes = ("unsafe-torch-load",)
    tokens = (("torch",), ("load",))
    keep = ("load",)
    # torch.load itself, `load` imported by name, or torch under another name (import torch as th)
    pattern = r"torch\s*\.\s*load\b|import\b[^\n]*\bload\b|\bimport\s+torch\s+as\b"

    def _is_torch_load(self, func: cst.BaseExpression) -> bool:
        """``torch.load`` (``th.load``) by its written form where that decides it: ``json.load`` and
        ``pickle.load`` are not, and need no scope analysis; anything else asks for qualified names."""
        if not self.ctx.maybe(func, "load"):
            return False
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            if self.ctx.is_torch(func.value):
                return True
            if func.value.value not in self.ctx.aliases:  # json.load, pickle.load, safetensors' load
                return False
        return "torch.load" in self.ctx.qnames(func)

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_torch_load(node.func):
            return
        given = kwarg(node, "weights_only")
        if given is not None and dotted(given.value) != "False":
            return  # True, or a value the caller passes in (timm's weights_only=weights_only): decided there
        if self._in_weights_only_branch(node):
            return  # the code already chooses between the two on purpose
        positional = [a for a in node.args if a.keyword is None]
        plain = (given is None and kwarg(node, "pickle_module") is None and len(positional) <= 2
                 and not any(a.star for a in node.args))

        def add(u: cst.Call) -> cst.Call:
            return append_arg(u, keyword_arg("weights_only", cst.Name("True")))

        if given is None:
            safe_call = self.ctx.code(add(node))
        else:
            safe_call = self.ctx.code(node.with_changes(args=[
                a.with_changes(value=cst.Name("True")) if a is given else a for a in node.args]))
        if given is not None:
            message = (f"torch.load with weights_only={self.ctx.code(given.value)} unpickles arbitrary objects: "
                       "a tampered checkpoint runs code on load. Keep it only for files you trust.")
        else:
            message = ("torch.load unpickles arbitrary objects (before torch 2.6): a tampered checkpoint runs "
                       "code on load. Load with weights_only=True" + (
                           "." if plain else " (pickle_module or **kwargs here: check them first)."))
        rewrite = plain and self._feeds_load_state_dict(node)
        fix = safe_call if rewrite else f"{safe_call}  # tensors, dicts, lists, numbers only\n{_ALTERNATIVES}"
        self.report(node, "unsafe-torch-load", message, fix, rewritten=rewrite)
        if rewrite:
            self.replace(node, add)

    def _feeds_load_state_dict(self, node: cst.Call) -> bool:
        """``model.load_state_dict(torch.load(...))``: the value is a state dict, which
        ``weights_only=True`` always loads."""
        arg = self.ctx.parent(node)
        call = self.ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and last_name(call.func) == "load_state_dict" and \
            arg.keyword is None and call.args[0] is arg

    def _in_weights_only_branch(self, node: cst.CSTNode) -> bool:
        parent = self.ctx.parent(node)
        while parent is not None:
            if isinstance(parent, (cst.If, cst.IfExp)) and "weights_only" in self.ctx.code(parent.test):
                return True
            parent = self.ctx.parent(parent)
        return False
