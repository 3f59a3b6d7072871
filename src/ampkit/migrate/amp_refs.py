"""Every use of the deprecated ``torch.{cuda,cpu,musa}.amp`` namespace in a file, and whether it
can be rewritten.

The rules for autocast, GradScaler and custom_fwd/bwd rewrite call sites; the import rule moves
``from torch.cuda.amp import X`` to ``torch.amp``. Both must agree: an import moves only when every
use of the names it binds is rewritten, else old and new would mix. That decision lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import libcst as cst

from ampkit.migrate._cst import dotted

if TYPE_CHECKING:
    from ampkit.migrate.context import Context

__all__ = ["AmpRef", "AmpRefs", "analyse", "refs_of", "APIS", "OLD_API"]

APIS = ("autocast", "GradScaler", "custom_fwd", "custom_bwd")
OLD_API = re.compile(r"torch\.(cuda|cpu|musa)\.amp(?:\.(.+))?")
_OLD_PARENT = re.compile(r"torch\.(cuda|cpu|musa)")


@dataclass(frozen=True)
class AmpRef:
    """One reference. ``style``: ``rooted`` (``torch.cuda.amp.X``), ``name`` (``from ... import X``),
    ``module`` (``amp.X`` with ``amp`` imported from torch.cuda), ``ambiguous`` (the name is also
    bound to something else) or ``other``."""

    node: cst.BaseExpression
    vendor: str
    api: str | None
    style: str
    binding: str | None
    call: cst.Call | None
    decorator: bool
    rewrite: bool
    #: in version- or feature-dependent code (see Context.in_fallback): left alone, not reported
    fallback: bool = False


@dataclass
class AmpRefs:
    refs: list[AmpRef] = field(default_factory=list)
    # import node (ImportFrom, or ImportAlias of `import torch.cuda.amp as amp`) -> new module
    moves: dict[cst.CSTNode, str] = field(default_factory=dict)
    stuck_imports: list[cst.CSTNode] = field(default_factory=list)
    fallback_imports: list[cst.CSTNode] = field(default_factory=list)


@dataclass
class _Import:
    node: cst.CSTNode
    new_module: str
    locals: list[str]
    all_known: bool
    fallback: bool = False


class _Imports(cst.CSTVisitor):
    def __init__(self, ctx: "Context") -> None:
        super().__init__()
        self.ctx = ctx
        self.imports: list[_Import] = []
        self.names: set[str] = set()  # locals bound to one API object
        self.modules: set[str] = set()  # locals bound to a torch.X.amp module

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted(node.module) if not node.relative else None
        if module is None:
            return
        old_amp, old_parent = OLD_API.fullmatch(module), _OLD_PARENT.fullmatch(module)
        if not (old_amp and old_amp.group(2) is None) and not old_parent:
            return
        if isinstance(node.names, cst.ImportStar):
            self.imports.append(_Import(node, "", [], False))
            return
        locals_, known = [], True
        for alias in node.names:
            name = alias.name.value
            local = alias.asname.name.value if alias.asname else name
            if old_amp and name in APIS:
                self.names.add(local)
            elif old_parent and name == "amp":
                self.modules.add(local)
            else:
                known = False
            locals_.append(local)
        if old_amp or any(a.name.value == "amp" for a in node.names):
            fallback = self.ctx.in_fallback(node)
            self.imports.append(_Import(node, "torch.amp" if old_amp else "torch", locals_, known and not fallback,
                                        fallback))

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            m = OLD_API.fullmatch(dotted(alias.name) or "")
            if m and m.group(2) is None and alias.asname is not None:
                local = alias.asname.name.value
                self.modules.add(local)
                fallback = self.ctx.in_fallback(node)
                self.imports.append(_Import(alias, "torch.amp", [local], not fallback, fallback))


class _Refs(cst.CSTVisitor):
    def __init__(self, ctx: "Context", imports: _Imports) -> None:
        super().__init__()
        self.ctx, self.imports = ctx, imports
        self.refs: list[AmpRef] = []

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        # The outermost matching node is the reference; its inner parts are not visited again.
        return not self._check(node)

    def _check(self, node: cst.BaseExpression) -> bool:
        names = self.ctx.qnames(node)
        match = next((m for q in names if (m := OLD_API.fullmatch(q))), None)
        if match is None:
            return False
        vendor, tail = match.group(1), match.group(2)
        api = tail if tail in APIS else None
        style, binding = self._style(node)
        shim = False
        if any(not OLD_API.fullmatch(q) for q in names):
            # try: from torch.amp import X / except ImportError: from torch.cuda.amp import X --
            # the call may already be written for the new API; adding a device could break it.
            style = "ambiguous"
            # When the other binding IS the new API, the name is a compat shim: correct as written.
            shim = any(q.startswith("torch.amp.") or q == "torch.autocast" for q in names)
        parent = self.ctx.parent(node)
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        decorator = isinstance(parent, cst.Decorator) and parent.decorator is node
        fallback = shim or self.ctx.in_fallback(node)
        ok = api is not None and style in ("rooted", "name", "module") and _rewritable(api, call, decorator) \
            and not fallback
        self.refs.append(AmpRef(node, vendor, api, style, binding, call, decorator, ok, fallback))
        return True

    def _style(self, node: cst.BaseExpression) -> tuple[str, str | None]:
        if isinstance(node, cst.Name):
            return ("name", node.value) if node.value in self.imports.names else ("other", None)
        parts = (dotted(node) or "").split(".")
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        if len(parts) == 4 and parts[2] == "amp" and "torch" in self.ctx.qnames(root):
            return "rooted", None
        if len(parts) == 2 and parts[0] in self.imports.modules:
            return "module", parts[0]
        return "other", None


def _rewritable(api: str, call: cst.Call | None, decorator: bool) -> bool:
    if call is None:
        return decorator and api in ("custom_fwd", "custom_bwd")
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if api == "autocast":  # positional arguments become keywords: their position must be known
        return not any(a.star for a in call.args) and len(positional) <= 3
    if api == "GradScaler":
        return len(positional) <= 5
    return len(positional) <= 1


def analyse(ctx: "Context") -> AmpRefs:
    """Find the references and decide which imports move."""
    imports = _Imports(ctx)
    ctx.walk([imports])
    finder = _Refs(ctx, imports)
    ctx.walk([finder])
    stuck_locals = {r.binding for r in finder.refs if r.binding and not r.rewrite}
    changed = True
    while changed:  # an import that cannot move pins every name it binds, and vice versa
        changed = False
        for imp in imports.imports:
            if (not imp.all_known or stuck_locals.intersection(imp.locals)) and \
                    not stuck_locals.issuperset(imp.locals):
                stuck_locals.update(imp.locals)
                changed = True
    result = AmpRefs()
    for imp in imports.imports:
        if imp.all_known and not stuck_locals.intersection(imp.locals):
            result.moves[imp.node] = imp.new_module
        elif imp.fallback or all(r.fallback for r in finder.refs if r.binding in imp.locals) and \
                any(r.binding in imp.locals for r in finder.refs):
            result.fallback_imports.append(imp.node)  # serves old torch on purpose: not reported
        else:
            result.stuck_imports.append(imp.node)
    for r in finder.refs:
        if r.rewrite and r.binding in stuck_locals:
            r = replace(r, rewrite=False)
        result.refs.append(r)
    return result


def refs_of(ctx: "Context") -> AmpRefs:
    """The file's AMP references, analysed once per file."""
    return ctx.analysis(analyse)
