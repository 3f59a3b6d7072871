"""``--target musa`` / ``--target cuda``: move device-specific code to one vendor.

``"cuda"``/``"cuda:0"`` strings (also ``f"cuda:{rank}"``, ``"cuda:%d" % rank`` and
``"cuda:{}".format(rank)``), ``.cuda()``, the ``torch.cuda.X`` runtime calls with a ``torch.musa``
twin, ``torch.amp.GradScaler()`` without a device (its default is "cuda"), and ``"nccl"`` when the file's
device moves too (and the reverse for ``--target cuda``, which
also drops ``import torch_musa``). A vendor dispatcher that already handles the target
(``if device_type == "cuda": ... elif device_type == "musa": ...``, ``("cuda", "musa")``) is left
alone, or it would become two branches for one vendor. What cannot be moved safely
(``.cuda(rank)``, a ``torch.cuda`` function without a twin, a backend chosen by
``dist.is_nccl_available()``) is reported.
"""

from __future__ import annotations

import re

import libcst as cst

from ampkit.migrate._cst import dotted, last_name, prepend_arg, string_value
from ampkit.migrate._walk import walk
from ampkit.migrate.context import VENDOR_SWAP
from ampkit.migrate.device_resolve import device_type_of
from ampkit.migrate.rules._amp import scaler_without_device
from ampkit.migrate.rules.base import Rule

__all__ = ["DeviceTargetRule", "TWINS"]

# torch.cuda functions that torch.musa mirrors (MUSA.md).
TWINS = frozenset({
    "synchronize", "device_count", "is_available", "current_device", "set_device", "empty_cache",
    "max_memory_allocated", "memory_allocated", "reset_peak_memory_stats", "manual_seed",
    "manual_seed_all", "get_device_name", "get_device_properties", "get_device_capability",
    "Event", "Stream", "is_bf16_supported", "mem_get_info", "get_rng_state", "set_rng_state",
})
_BACKEND = {"musa": ("nccl", "mccl"), "cuda": ("mccl", "nccl")}
# A device string, or a template for one: "cuda", "cuda:0", "cuda:%d", "cuda:{}", "cuda:{rank}".
_TEMPLATE = re.compile(r"(cuda|musa)(:(?:\d+|%[ds]|\{\w*\}))?")
# Calls whose string arguments are path parts ("csrc", "cuda", "*.cu"), not devices.
_PATH_CALLS = frozenset({"join", "glob", "iglob", "Path", "PurePath"})
# Keywords whose string value is a name (an argparse flag, a destination), not a device.
_NAME_KEYWORDS = frozenset({"name", "dest", "prefix"})


class DeviceTargetRule(Rule):
    codes = ()

    @classmethod
    def applies(cls, ctx) -> bool:
        return ctx.target in VENDOR_SWAP

    @classmethod
    def may_match(cls, text: str, target: str) -> bool:
        if target not in VENDOR_SWAP:
            return False
        src = VENDOR_SWAP[target][0]
        return src in text or _BACKEND[target][0] in text or (target == "musa" and "GradScaler" in text)

    def visit_Module(self, node: cst.Module) -> None:
        self.src, self.dst = VENDOR_SWAP[self.ctx.target]
        self.backend = _BACKEND[self.ctx.target]
        self._moved = False  # a device moved: the collective backend may follow
        self._backends: list[cst.SimpleString] = []

    def leave_Module(self, node: cst.Module) -> None:
        old, new = self.backend
        for string in self._backends:
            if self._moved:
                self.replace(string, lambda u: u.with_changes(value=f"{u.prefix}{u.quote}{new}{u.quote}"))
            else:
                self.report(string, "deprecated-amp-api",
                            f'"{old}" was not moved to "{new}": nothing in this file puts the model on a '
                            f"{self.dst} device, and the backend must match the device it runs on.",
                            f'backend = "{new}" if device.type == "{self.dst}" else "gloo"')

    # Dispatchers that already handle both vendors: not a line of them changes.
    def _handles_both(self, *nodes: cst.CSTNode) -> bool:
        found: set[str] = set()
        ctx = self.ctx

        class _Vendors(cst.CSTVisitor):
            def visit_SimpleString(self, n: cst.SimpleString) -> None:
                found.add(device_type_of(string_value(n)) or "")

            def visit_Attribute(self, n: cst.Attribute) -> None:  # torch.cuda / torch.musa
                if ctx.is_torch(n.value):
                    found.add(n.attr.value)

        for n in nodes:
            walk(n, [_Vendors()])
        return {self.src, self.dst} <= found

    def visit_If(self, node: cst.If) -> bool:
        # The whole if / elif chain: its tests and the simple statements directly in its branches
        # (`DEVICE = "cuda"` / `DEVICE = "musa"`), not blocks nested deeper.
        parts: list[cst.CSTNode] = []
        branch: cst.CSTNode | None = node
        while branch is not None:
            if isinstance(branch, cst.If):
                parts.append(branch.test)
            body = branch.body
            parts.extend(st for st in getattr(body, "body", ()) if isinstance(st, cst.SimpleStatementLine))
            branch = branch.orelse if isinstance(branch, cst.If) else None
        return not self._handles_both(*parts)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        # def cuda(self) next to def musa(self), is_cuda_available next to is_musa_available:
        # code that serves both vendors already; moving one makes two for the same vendor.
        name = node.name.value
        if self.src not in name.split("_"):
            return True
        twin = "_".join(self.dst if part == self.src else part for part in name.split("_"))
        siblings = getattr(self.ctx.parent(node), "body", ())
        return not any(isinstance(st, cst.FunctionDef) and st.name.value == twin for st in siblings)

    def visit_IfExp(self, node: cst.IfExp) -> bool:
        if "nccl_available" in self.ctx.code(node.test) or "mccl_available" in self.ctx.code(node.test):
            self.report(node, "deprecated-amp-api",
                        f"a backend chosen by `{self.ctx.code(node.test)}` was left as is: that test says nothing "
                        f"about {self.dst}; choose the backend from the device you run on.",
                        f'backend = "{self.backend[1]}" if device.type == "{self.dst}" else "gloo"')
            return False
        return not self._handles_both(node)

    def visit_Tuple(self, node: cst.Tuple) -> bool:
        return not self._handles_both(node)

    def visit_List(self, node: cst.List) -> bool:
        return not self._handles_both(node)

    def visit_Set(self, node: cst.Set) -> bool:
        return not self._handles_both(node)

    def visit_Dict(self, node: cst.Dict) -> bool:
        return not self._handles_both(node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is None:
            return
        m = _TEMPLATE.fullmatch(value)
        if m and m.group(1) == self.src and not m.group(2) and self._names_something(node):
            return
        if m and m.group(1) == self.src:
            new = self.dst + value[len(self.src):]
            self._moved = True
            self.replace(node, lambda u: u.with_changes(value=f"{u.prefix}{u.quote}{new}{u.quote}"))
        elif value == self.backend[0]:
            self._backends.append(node)

    def _names_something(self, node: cst.SimpleString) -> bool:
        """A bare "cuda" that is a name rather than a device (DeepLearningExamples): a folder in
        ``os.path.join(dir, "cuda", "*.cu")``, an argparse flag ``name="cuda"`` read back as
        ``args.cuda``, or a key of a keyword dict ``{"epochs": 3, "cuda": True}`` passed as ``**kw``."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Arg):
            if parent.keyword is not None:
                return parent.keyword.value in _NAME_KEYWORDS
            call = self.ctx.parent(parent)
            return isinstance(call, cst.Call) and last_name(call.func) in _PATH_CALLS
        if isinstance(parent, cst.DictElement) and parent.key is node:
            keys = [string_value(e.key) for e in getattr(self.ctx.parent(parent), "elements", ())
                    if isinstance(e, cst.DictElement)]
            return any(k is not None and device_type_of(k) is None for k in keys)
        return False

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        # f"cuda:{rank}": the text before the first placeholder names the device.
        parts = node.parts
        if len(parts) >= 2 and isinstance(parts[0], cst.FormattedStringText) and \
                parts[0].value == f"{self.src}:" and isinstance(parts[1], cst.FormattedStringExpression):
            self._moved = True
            self.replace(parts[0], lambda u: u.with_changes(value=f"{self.dst}:"))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # torch.cuda.synchronize -> torch.musa.synchronize
        inner = node.value
        if not (isinstance(inner, cst.Attribute) and inner.attr.value == self.src
                and self.ctx.is_torch(inner.value)):
            return
        if node.attr.value in TWINS:
            self._moved = True
            self.replace(node, lambda u: u.with_changes(value=u.value.with_changes(attr=cst.Name(self.dst))))
        elif node.attr.value != "amp":  # the amp rules handle torch.cuda.amp
            self.report(node, "deprecated-amp-api",
                        f"`{dotted(node)}` has no torch.{self.dst} twin that migrate knows; left as is.",
                        f"check torch.{self.dst} for an equivalent, or use the device-generic torch API")

    def visit_Call(self, node: cst.Call) -> None:
        # A scaler given no device is a "cuda" scaler (torch_musa replaces FSDP's ShardedGradScaler itself).
        if self.dst == "musa" and scaler_without_device(self, node):
            self._moved = True
            device = self.ctx.literal(self.dst)
            self.replace(node, lambda u: prepend_arg(u, cst.Arg(cst.SimpleString(device))))
            return
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == self.src) \
                or self.ctx.is_torch(func.value):
            return
        positional = [a for a in node.args if a.keyword is None]
        device = self.ctx.literal(self.dst)
        if not positional and not any(a.keyword.value == "device" for a in node.args):
            self._moved = True
            self.replace(node, lambda u: prepend_arg(u.with_changes(func=u.func.with_changes(attr=cst.Name("to"))),
                                                     cst.Arg(cst.SimpleString(device))))
        elif len(positional) == 1 and isinstance(positional[0].value, cst.Integer) and not positional[0].star:
            index = positional[0].value.value
            literal = cst.SimpleString(self.ctx.literal(f"{self.dst}:{index}"))
            self._moved = True
            self.replace(node, lambda u: u.with_changes(
                func=u.func.with_changes(attr=cst.Name("to")),
                args=[u.args[0].with_changes(value=literal), *u.args[1:]]))
        else:
            self.report(node, "deprecated-amp-api",
                        f"`.{self.src}(...)` with a device argument was not rewritten for --target {self.dst}: "
                        "the argument may be an index or a device.",
                        f'.to(torch.device("{self.dst}", index))  # index: int')

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.dst != "cuda" or len(node.body) != 1 or not isinstance(node.body[0], cst.Import):
            return
        names = node.body[0].names
        keep = [a for a in names if dotted(a.name) != "torch_musa" or a.asname is not None]
        if len(keep) == len(names):
            return
        if not keep:  # CUDA machines have no torch_musa: the import would fail there
            self.replace(node, lambda u: cst.RemovalSentinel.REMOVE)
            return

        def drop(u: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
            imp = u.body[0]
            kept = [a for a in imp.names if dotted(a.name) != "torch_musa" or a.asname is not None]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return u.with_changes(body=[imp.with_changes(names=kept)])

        self.replace(node, drop)
