"""Which device expression a rewritten AMP call should take, from the code around it.

``--target agnostic`` keeps the device the code already uses: a ``device_type``/``device``/``DEVICE``
variable visible at the call. A string constant gives its device type as a literal; a variable
that holds something else gives an expression that is a device-type string at run time. Nothing
found: the old API's vendor, and the caller reports a ``deprecated-amp-api`` finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ampkit.migrate._cst import dotted, string_value

if TYPE_CHECKING:
    from ampkit.migrate.context import Context

__all__ = ["DeviceChoice", "DeviceResolver", "devices_of", "NEW_DEFAULT_DTYPE", "OLD_DEFAULT_DTYPE"]

# Looked up in this order; ``*_type`` names hold a device-type string by convention (nanoGPT).
DEVICE_NAMES = ("device_type", "DEVICE_TYPE", "device", "DEVICE")
ACCELERATORS = frozenset({"cuda", "musa"})
# The dtype torch.amp.autocast(<device>) uses without dtype=, and the one the old API used.
NEW_DEFAULT_DTYPE = {"cpu": "bfloat16", "cuda": "float16", "musa": "float16"}
OLD_DEFAULT_DTYPE = {"cpu": "bfloat16", "cuda": "float16", "musa": "float16"}
_DEVICE_STR = re.compile(r"(cpu|cuda|musa|xpu|mps|npu|hpu)(:\d+)?")


@dataclass(frozen=True)
class DeviceChoice:
    """``code`` goes into the call; ``literal`` is its device type when known statically."""

    code: str
    literal: str | None
    fallback: bool = False
    why: str = ""


@dataclass(frozen=True)
class _Binding:
    line: int
    value: cst.BaseExpression | None
    annotation: cst.BaseExpression | None = None
    is_param: bool = False


class _Collector(cst.CSTVisitor):
    """Assignments and parameters named like a device, per function and for the module."""

    def __init__(self, ctx: "Context") -> None:
        super().__init__()
        self.ctx = ctx
        self.scopes: dict[cst.CSTNode, dict[str, list[_Binding]]] = {}
        self._stack: list[dict[str, list[_Binding]] | None] = []

    def _add(self, name: str, binding: _Binding) -> None:
        if self._stack and self._stack[-1] is not None and name in DEVICE_NAMES:
            self._stack[-1].setdefault(name, []).append(binding)

    def _target(self, target: cst.BaseExpression, value: cst.BaseExpression | None, line: int) -> None:
        if isinstance(target, cst.Name):
            self._add(target.value, _Binding(line, value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._target(el.value, None, line)

    def visit_Module(self, node: cst.Module) -> None:
        self._stack.append(self.scopes.setdefault(node, {}))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        table = self.scopes.setdefault(node, {})
        self._stack.append(table)
        params = node.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            ann = p.annotation.annotation if p.annotation else None
            self._add(p.name.value, _Binding(0, None, ann, is_param=True))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._stack.append(None)  # class attributes are not visible inside methods

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._stack.pop()

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._target(t.target, node.value, self.ctx.line(node))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target, node.value, self.ctx.line(node))

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target, None, self.ctx.line(node))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._target(node.asname.name, None, self.ctx.line(node))


def device_type_of(text: str | None) -> str | None:
    """``"cuda:0"`` -> ``"cuda"``; None for anything that is not a device string."""
    m = _DEVICE_STR.fullmatch(text) if text is not None else None
    return m.group(1) if m else None


class DeviceResolver:
    """Answers :meth:`resolve` for any node of the file."""

    def __init__(self, ctx: "Context") -> None:
        self.ctx = ctx
        collector = _Collector(ctx)
        ctx.walk([collector])
        self._scopes = collector.scopes

    def _enclosing(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """Function scopes around ``node``, innermost first, then the module.

        A decorator or default value belongs to the scope around its ``def``, not inside it.
        """
        chain: list[cst.CSTNode] = []
        child, parent = node, self.ctx.parent(node)
        while parent is not None:
            if isinstance(parent, cst.FunctionDef) and child is parent.body:
                chain.append(parent)
            child, parent = parent, self.ctx.parent(parent)
        chain.append(self.ctx.module)
        return chain

    def resolve(self, node: cst.CSTNode, vendor: str) -> DeviceChoice:
        """The device for an old ``torch.<vendor>.amp`` call at ``node``."""
        found = self._find(node, vendor)
        if found is not None:
            return found
        device = self.ctx.retarget(vendor)
        return DeviceChoice(self.ctx.literal(device), device, fallback=self.ctx.target == "agnostic",
                            why="no device_type/device/DEVICE variable is visible here")

    def visible(self, node: cst.CSTNode, vendor: str) -> DeviceChoice | None:
        """The device variable visible at ``node`` (as :meth:`resolve` would use it), or None."""
        return self._find(node, vendor)

    def _find(self, node: cst.CSTNode, vendor: str) -> DeviceChoice | None:
        line = self.ctx.line(node)
        chain = self._enclosing(node)
        shadowed: set[str] = set()
        for depth, scope in enumerate(chain):
            table = self._scopes.get(scope, {})
            for name in DEVICE_NAMES:
                if name in shadowed or name not in table:
                    continue
                shadowed.add(name)
                bindings = table[name]
                if depth == 0:  # same scope as the call: only what is bound before it
                    bindings = [b for b in bindings if b.is_param or b.line < line]
                if bindings:
                    return self._choose(name, bindings, vendor)
        return None

    def _choose(self, name: str, bindings: list[_Binding], vendor: str) -> DeviceChoice | None:
        literals = [device_type_of(string_value(b.value)) for b in bindings]
        if all(literals) and len(set(literals)) == 1:
            device = literals[0]
            # A constant naming another kind of device (cpu code calling the cuda API, say) would
            # change what autocast does; only the cuda <-> musa port is safe to follow.
            if device != vendor and not (device in ACCELERATORS and vendor in ACCELERATORS):
                return None
            device = self.ctx.retarget(device)
            return DeviceChoice(self.ctx.literal(device), device)
        if name.lower().endswith("type"):
            return DeviceChoice(name, None)
        if all(self._is_device_object(b) for b in bindings):
            return DeviceChoice(f"{name}.type", None)
        if all(_is_bare_device_string(b.value) for b in bindings):
            return DeviceChoice(name, None)
        if self.ctx.torch_name:  # str or torch.device, with or without an index
            return DeviceChoice(f"{self.ctx.torch_name}.device({name}).type", None)
        return None

    def _is_device_object(self, b: _Binding) -> bool:
        if b.is_param:
            return b.annotation is not None and (dotted(b.annotation) or "").endswith("device") and \
                "torch.device" in self.ctx.qnames(b.annotation)
        value = b.value
        if isinstance(value, cst.Call):
            return self.ctx.maybe(value.func, "device") and "torch.device" in self.ctx.qnames(value.func)
        return isinstance(value, cst.Attribute) and value.attr.value == "device"


def _is_bare_device_string(value: cst.BaseExpression | None) -> bool:
    """A string that is a device type without an index, or a conditional choosing between such."""
    if isinstance(value, cst.IfExp):
        return _is_bare_device_string(value.body) and _is_bare_device_string(value.orelse)
    text = string_value(value)
    return text is not None and ":" not in text and device_type_of(text) is not None


def devices_of(ctx: "Context") -> DeviceResolver:
    """The file's device resolver, built once per file."""
    return ctx.analysis(DeviceResolver)
