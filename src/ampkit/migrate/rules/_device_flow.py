"""Where a device string goes, for ``--target``: into a framework's own names, into a message, or into a
test that cannot be moved.

* **Framework names.** Lightning's ``accelerator=`` takes its own registered names ("cuda", "gpu", ...),
  not torch devices, and rejects "musa". A string reaches it directly (``Fabric(accelerator="cuda")``),
  through a variable assigned earlier (``accel = "cuda" if ... else "cpu"`` then
  ``L.Fabric(accelerator=accel)``), through a parameter's default, or through a setting named for it
  (``parser.add_argument("--accelerator", default="cuda")``, ``cfg.accelerator = "gpu"``,
  ``{"accelerator": "cuda"}``). Such a string is reported and its whole statement left as it is: moving
  ``torch.cuda.is_available()`` next to a "cuda" that stays would be a half-port.
* **Prose.** A string printed or logged (``print("cuda:", ...)``, ``logger.info(f"cuda:{rank}")``, also
  inside an f-string, a ``%``-format or ``.format``) names nothing that runs: it is neither moved nor
  reported, and neither is ``torch.version.cuda`` there.
* **Tests that cannot move.** A string that names the vendor but is not a device or a prefix of one
  (``re.match(r"cuda:\\d+", dev)``, ``re.search("^cuda", dev)``), compared with or searched in a device, is
  reported: leaving it while the device moves is a half-port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from ampkit.migrate._cst import last_name, string_value
from ampkit.migrate._walk import walk

__all__ = ["FrameworkFlow", "framework_flow", "is_prose", "in_test", "device_pattern", "FRAMEWORK_KEYWORD", "sink_words"]

FRAMEWORK_KEYWORD = "accelerator"
# A file can hold a framework name only when it sets something named `accelerator` (not to `Accelerator(...)`,
# Hugging Face Accelerate's object, nor passes `accelerator=accelerator` on): a cheap test before any walk.
_SINK_TEXT = re.compile(r"""\baccelerator\s*(?::\s*[\w.\[\]]+\s*)?=(?!=)\s*(?!accelerator\b|Accelerator\b)"""
                        r"""|["']-*accelerator["']""")
# `accelerator=NAME` / `accelerator=args.NAME` given to a call: the names whose statements the flow reads.
_SINK_ARG = re.compile(r"[(,]\s*accelerator\s*=\s*([A-Za-z_][\w.]*)(?!\s*[(\[\w])")
# Calls whose arguments are printed or logged, not run.
_LOG_CALLS = frozenset({"print", "pprint", "info", "debug", "warning", "warn", "error", "critical", "exception", "log",
                        "write", "echo", "secho", "print_rank_0", "rank_zero_info", "rank_zero_warn",
                        "rank_zero_print", "set_description", "set_postfix_str", "add_text", "fatal"})
# Calls that only turn their argument into text on the way to a message.
_TEXT_CALLS = frozenset({"str", "repr", "format", "join"})
# Calls that test or search a string: a vendor word given to them is a test of the device's text.
_STRING_TESTS = frozenset({"startswith", "endswith", "match", "fullmatch", "search", "findall", "finditer",
                           "compile", "sub", "subn", "split", "find", "rfind", "index", "count", "replace"})
_MAX_HOPS = 4
# What a framework name of a GPU vendor looks like (Lightning: "cuda", "gpu"; a "cuda:0" is still one of them).
_NAMES = re.compile(r"(?:cuda|musa)(?::\d+)?|gpu")


def sink_words(code: str) -> tuple[str, ...]:
    """What a statement must hold for the flow to read it (``Rule.keep_words``): the names and attributes
    handed to ``accelerator=``, so ``L.Fabric(accelerator=accel)`` and ``accel = ...`` stay in the partial
    parse."""
    if not _SINK_TEXT.search(code):
        return ()
    return tuple(sorted({m.group(1) for m in _SINK_ARG.finditer(code) if m.group(1) != FRAMEWORK_KEYWORD}))


@dataclass
class _Scope:
    bindings: dict[str, list[tuple[cst.BaseExpression, cst.CSTNode]]] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameworkUse:
    """Where a string is used as a framework's name: the ``accelerator=`` argument (or setting) and how."""

    node: cst.CSTNode
    via: str  # the variable or setting the string passes through
    setting: bool = False  # `via` is a setting by name (`--accelerator`, `cfg.accelerator`), not a variable


class _Collector(cst.CSTVisitor):
    """Bindings per scope (assignments, parameter defaults) and the places a framework name is given."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: dict[cst.CSTNode, _Scope] = {}
        self.stack: list[cst.CSTNode] = []
        self.sinks: list[tuple[cst.BaseExpression, cst.CSTNode, cst.CSTNode, str]] = []  # value, use, scope, via
        self.attr_sinks: set[str] = {FRAMEWORK_KEYWORD}  # settings whose value reaches accelerator=
        # (name, value, statement, plain): what sets something by name; plain for a variable or parameter,
        # which only a setting called `accelerator` itself reaches (a local `device` is not `args.device`)
        self.settings: list[tuple[str, cst.BaseExpression, cst.CSTNode, bool]] = []
        self.statement: cst.CSTNode | None = None

    def _bind(self, name: str, value: cst.BaseExpression, statement: cst.CSTNode) -> None:
        self.scopes[self.stack[-1]].bindings.setdefault(name, []).append((value, statement))

    def visit_Module(self, node: cst.Module) -> None:
        self.stack.append(node)
        self.scopes[node] = _Scope()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(node)
        self.scopes[node] = _Scope()
        params = node.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            if p.default is not None:
                self._bind(p.name.value, p.default, p)
                self.settings.append((p.name.value, p.default, p, True))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statement = node

    def _targets(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self._bind(target.value, value, self.statement)
            self.settings.append((target.value, value, self.statement, True))
        elif isinstance(target, cst.Attribute):
            self.settings.append((target.attr.value, value, self.statement, False))
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and \
                len(target.elements) == len(value.elements):  # accelerator, devices = "gpu", [0]
            for t, v in zip(target.elements, value.elements):
                self._targets(t.value, v.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._targets(t.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._targets(node.target, node.value)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        key = string_value(node.key)
        if key is not None and self.statement is not None:
            self.settings.append((key, node.value, self.statement, False))

    def visit_Call(self, node: cst.Call) -> None:
        if last_name(node.func) == "add_argument" and self.statement is not None:
            flags = [string_value(a.value) for a in node.args if a.keyword is None]
            dest = next((string_value(a.value) for a in node.args if a.keyword and a.keyword.value == "dest"), None)
            default = next((a.value for a in node.args if a.keyword and a.keyword.value == "default"), None)
            names = [dest] if dest else [f.lstrip("-").replace("-", "_") for f in flags if f]
            if default is not None:
                self.settings.extend((n, default, self.statement, False) for n in names)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None or node.keyword.value != FRAMEWORK_KEYWORD:
            return
        value = node.value
        if isinstance(value, cst.Name):
            self.sinks.append((value, node, self.stack[-1], value.value))
        elif isinstance(value, cst.Attribute):
            self.attr_sinks.add(value.attr.value)


class FrameworkFlow:
    """The strings of a file that reach a framework's own names, and the statements left whole for them."""

    def __init__(self, enclosing, walker) -> None:
        self.uses: dict[cst.SimpleString, FrameworkUse] = {}
        self.frozen: set[cst.CSTNode] = set()
        collector = _Collector()
        walker([collector])
        for setting, value, statement, plain in collector.settings:
            if setting == FRAMEWORK_KEYWORD or not plain and setting in collector.attr_sinks:
                self._take(value, statement, FrameworkUse(statement, setting, setting=True))
        for _, use, _, name in collector.sinks:
            self._follow(name, enclosing(use, collector.scopes), FrameworkUse(use, name), 0, set())

    def _follow(self, name: str, chain: list[_Scope], use: FrameworkUse, hops: int, seen: set[str]) -> None:
        """Every value bound to ``name`` in the nearest scope that binds it, and on through plain names."""
        if hops > _MAX_HOPS or name in seen:
            return
        seen.add(name)
        for scope in chain:
            if name in scope.bindings:
                for value, statement in scope.bindings[name]:
                    self._take(value, statement, use)
                    if isinstance(value, cst.Name):
                        self._follow(value.value, chain, use, hops + 1, seen)
                return

    def _take(self, value: cst.BaseExpression, statement: cst.CSTNode, use: FrameworkUse) -> None:
        found: list[cst.SimpleString] = []

        class _Strings(cst.CSTVisitor):
            def visit_SimpleString(self, node: cst.SimpleString) -> None:
                found.append(node)

            def visit_Call(self, node: cst.Call) -> bool:  # a string given to a call is that call's argument
                return False

        if isinstance(value, cst.SimpleString):
            found.append(value)
        else:
            walk(value, [_Strings()])
        named = [s for s in found if _NAMES.fullmatch(string_value(s) or "")]
        if named:
            self.frozen.add(statement)
            for s in named:
                self.uses.setdefault(s, use)


def framework_flow(ctx) -> FrameworkFlow | None:
    """The file's :class:`FrameworkFlow`, built once; None when the file sets nothing named ``accelerator``."""
    if not _SINK_TEXT.search(ctx.source):
        return None
    return ctx.analysis(_build)


def _build(ctx) -> FrameworkFlow:
    def enclosing(node: cst.CSTNode, scopes: dict[cst.CSTNode, _Scope]) -> list[_Scope]:
        """The scopes around ``node``, innermost first (a function's, then the module's)."""
        chain: list[_Scope] = []
        parent = ctx.parent(node)
        while parent is not None:
            if parent in scopes:
                chain.append(scopes[parent])
            parent = ctx.parent(parent)
        return chain

    return FrameworkFlow(enclosing, ctx.walk)


def _message_call(ctx, node: cst.CSTNode) -> cst.Call | None:
    """The call ``node`` is (part of) an argument of, looking through the text it is built into."""
    child, parent = node, ctx.parent(node)
    while parent is not None:
        if isinstance(parent, cst.Arg):
            call = ctx.parent(parent)
            if not isinstance(call, cst.Call) or last_name(call.func) not in _TEXT_CALLS:
                return call if isinstance(call, cst.Call) else None
            parent = call  # str(x), ", ".join(x): still text on its way somewhere
        elif isinstance(parent, cst.Attribute):
            if parent.value is not child or parent.attr.value not in _TEXT_CALLS:
                return None  # "cuda: {}".format(...) goes on; any other attribute of it does not
        elif isinstance(parent, cst.Call):
            if parent.func is not child:
                return None
        elif not isinstance(parent, (cst.FormattedStringExpression, cst.FormattedString, cst.ConcatenatedString,
                                     cst.BinaryOperation, cst.Tuple, cst.Element)):
            return None  # f"...{x}", "a" "b", "%s" % x, "a" + x: part of a text being built
        child, parent = parent, ctx.parent(parent)
    return None


def is_prose(ctx, node: cst.CSTNode) -> bool:
    """Whether ``node`` is printed or logged: (part of) an argument of ``print``/``logger.info``/...; such text
    runs nothing, so ``--target`` neither moves nor reports it."""
    call = _message_call(ctx, node)
    return call is not None and last_name(call.func) in _LOG_CALLS


def in_test(ctx, node: cst.SimpleString) -> bool:
    """Whether the string ``node`` is an operand of a comparison (``==``, ``in``) or given to a string test or
    search (``startswith``, ``re.match``, ``replace``)."""
    parent = ctx.parent(node)
    while isinstance(parent, (cst.ConcatenatedString, cst.Element, cst.Tuple, cst.List, cst.Set)):
        parent = ctx.parent(parent)
    if isinstance(parent, (cst.Comparison, cst.ComparisonTarget)):
        return True
    if isinstance(parent, cst.Arg):
        call = ctx.parent(parent)
        return isinstance(call, cst.Call) and last_name(call.func) in _STRING_TESTS
    return False


def device_pattern(vendor: str) -> re.Pattern[str]:
    """A string that spells a device of ``vendor`` or a pattern for one: it starts with the vendor, lower case
    as torch writes it (after a regular expression's ``^``, ``(`` or ``\\b``), and holds no space
    (``r"cuda:(\\d+)"``, ``"^cuda"``; not ``"torch.cuda"``, a key, nor ``"CUDA out of memory"``, a message)."""
    return re.compile(rf"(?:\^|\(|\\b)*{vendor}(?![A-Za-z0-9_])\S*")
