"""Per-file state the rules share: metadata look-ups, the target, and lazily built analyses."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Callable, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from ampkit.migrate._cst import dotted
from ampkit.migrate._lines import start_lines
from ampkit.migrate._walk import parents_of, walk
from ampkit.migrate._text import STAR_IMPORT, as_pairs, quote_counts

T = TypeVar("T")

__all__ = ["Context", "TARGETS", "VENDOR_SWAP", "DEFAULT_MUSA_VERSION", "parse_musa_version"]

TARGETS = ("agnostic", "cuda", "musa")
# A test that picks code by torch version or by feature: the code under it is a compatibility
# shim, written on purpose for old and new torch alike (ultralytics' TORCH_1_13, mmengine's
# digit_version(TORCH_VERSION), timm's hasattr(torch.cuda.amp, ...)).
_VERSION_TEST = re.compile(
    r"__version__|\bTORCH_\w*(?:\d|VERSION|GREATER|LESS|AVAILABLE)|torch_version|version\.parse|parse_version"
    r"|LooseVersion|digit_version|is_torch_\w+|\b(?:has|get)attr\(\s*torch\b|\bHAS_\w*AMP"
    r"|\bhas_native_amp\b|\bversion\s*[<>=]", re.IGNORECASE)
_FROM_TORCH = re.compile(r"^[ \t]*from\s+torch(?:\.\w+)*\s+import\s+(\([^)]*\)|[^\n]*)", re.MULTILINE)
_IMPORT_TORCH_AS = re.compile(r"\bimport\s+torch(?:\.\w+)*\s+as\s+(\w+)")
# What a `try: new API` / `except ...:` fallback catches when the new API is missing.
_FALLBACK_ERRORS = frozenset({"AttributeError", "TypeError", "ImportError", "ModuleNotFoundError", "NameError"})
# The torch_musa release assumed when --musa-version is not given: releases from 2.1 on load
# themselves with torch (an entry point), so no `import torch_musa` is added; older ones need it.
DEFAULT_MUSA_VERSION = (2, 7)
AUTOLOAD_MUSA_VERSION = (2, 1)
# target -> (vendor rewritten away, vendor written); "agnostic" swaps nothing.
VENDOR_SWAP = {"musa": ("cuda", "musa"), "cuda": ("musa", "cuda")}


class Context:
    """Everything a rule may ask about the file being migrated. Built once per file."""

    def __init__(self, module: cst.Module, *, target: str, filename: str, source: str,
                 musa_version: tuple[int, int] = DEFAULT_MUSA_VERSION) -> None:
        self.module = module
        self.source = source  # the file's whole text
        #: the torch_musa release the ported code will run on (``--musa-version``)
        self.musa_version = musa_version
        self._analyses: dict[object, object] = {}
        #: child -> parent for every node a walk from the module has entered (see :meth:`walk`)
        self._seen: dict[cst.CSTNode, cst.CSTNode] = {}
        self._fallback: dict[cst.CSTNode, bool] = {}
        self.target = target
        self.filename = filename

    @cached_property
    def wrapper(self) -> MetadataWrapper:
        return MetadataWrapper(self.module, unsafe_skip_copy=True)  # freshly parsed: nobody else holds it

    # Resolved on first use: the scope analysis behind qualified names costs more than parsing,
    # and a file that only the name-free rules look at never pays for it.
    @cached_property
    def _lines(self) -> dict[cst.CSTNode, int]:
        return start_lines(self.module, self.source)

    @cached_property
    def _parents(self):
        return parents_of(self.module)

    @cached_property
    def _qn(self):
        return self.wrapper.resolve(QualifiedNameProvider)

    # metadata
    def line(self, node: cst.CSTNode) -> int:
        return self._lines[node]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        found = self._seen.get(node)
        if found is None and node is not self.module:  # a node no walk has entered yet: map the whole tree
            return self._parents.get(node)
        return found

    def walk(self, visitors: list[cst.CSTVisitor]) -> None:
        """Run ``visitors`` over the whole module, noting each node's parent on the way (so :meth:`parent`
        rarely needs a separate pass over the tree)."""
        walk(self.module, visitors, self._seen)

    def qnames(self, node: cst.CSTNode) -> set[str]:
        if isinstance(node, cst.Attribute) and self.torch_name is not None:
            # torch.amp.autocast written through the module's own torch name: the qualified name is the
            # text itself (the assumption is_torch makes), no scope analysis needed
            name = dotted(node)
            head, _, rest = (name or "").partition(".")
            if head == self.torch_name and rest and self._imported_torch == self.torch_name:
                return {f"torch.{rest}"}
        value = self._qn.get(node)
        if value is None:
            return set()
        if callable(value):  # libcst hands out qualified names lazily
            value = value()
        names = {q.name for q in value}
        if not names and self._star_torch and isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted(node)  # `torch` from `from x import *`: torch.cuda.amp.autocast by its own name
            if name is not None and (name == "torch" or name.startswith("torch.")):
                return {name}
        return names

    @cached_property
    def _star_torch(self) -> bool:
        """Whether ``torch`` reaches the module only through ``from x import *`` (DeepLearningExamples'
        BART training_base.py): never imported or bound here, but used, next to a star import."""
        if self._imported_torch or not any(
                isinstance(st, cst.SimpleStatementLine) and isinstance(st.body[0], cst.ImportFrom)
                and isinstance(st.body[0].names, cst.ImportStar) for st in self.module.body):
            return False
        found: list[cst.Name] = []

        class _FirstTorch(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                if node.value == "torch" and not found:
                    found.append(node)

        self.walk([_FirstTorch()])
        if not found:
            return False
        value = self._qn.get(found[0])
        value = value() if callable(value) else value or ()
        return not value  # bound nowhere in the module: the star import brings it

    def is_torch(self, node: cst.BaseExpression) -> bool:
        """Whether ``node`` is the name the module binds to ``torch`` (``torch``, ``th``): a syntactic
        check, so a rule that needs only this never pays for the scope analysis behind qualified names."""
        return isinstance(node, cst.Name) and node.value == self.torch_name

    @cached_property
    def aliases(self) -> dict[str, set[str]]:
        """Name bound with ``as`` -> the last part of what it names (``S`` -> ``GradScaler`` for ``from
        torch.amp import GradScaler as S``). Textual, so a superset: ``with ... as f`` and prose count too."""
        found: dict[str, set[str]] = {}
        for original, alias in as_pairs(self.source):
            found.setdefault(alias, set()).add(original)
        return found

    @cached_property
    def _torch_roots(self) -> frozenset[str] | None:
        """The names through which code can reach torch: ``torch``, its alias, names imported from a
        ``torch...`` module, ``import torch.x as y`` aliases. None (anything may) after a star import."""
        if STAR_IMPORT.search(self.source):
            return None
        roots = {"torch", *(self.torch_name and [self.torch_name] or [])}
        for names in _FROM_TORCH.findall(self.source):
            for part in names.strip("()").replace("\\", " ").split(","):
                words = part.split("#")[0].split()
                if words:
                    roots.add(words[-1])  # `a` or the `b` of `a as b`
        roots.update(_IMPORT_TORCH_AS.findall(self.source))
        return frozenset(roots)

    def maybe(self, node: cst.BaseExpression, *last_names: str) -> bool:
        """Whether ``node`` could resolve to a torch qualified name ending in one of ``last_names``: written
        so and reaching torch through its first name (``torch.amp.GradScaler``, ``GradScaler`` imported
        from torch), or a name bound by ``as`` to one of them. A syntactic check, so a rule asks for
        qualified names (the costly scope analysis) only where the answer may be yes; never a false "no"
        (``accelerator.autocast()`` is a "no": ``accelerator`` does not come from torch)."""
        roots = self._torch_roots
        if isinstance(node, cst.Attribute):  # a qualified name ends in the attribute as written
            if node.attr.value not in last_names:
                return False
            while isinstance(node, cst.Attribute):
                node = node.value
            return roots is None or not isinstance(node, cst.Name) or node.value in roots
        if isinstance(node, cst.Name):
            if not self.aliases.get(node.value, set()).isdisjoint(last_names):
                return True
            return node.value in last_names and (roots is None or node.value in roots)
        return False

    def callee(self, func: cst.BaseExpression) -> str | None:
        """The name a call really calls: ``GradScaler`` for ``Scaler()`` after
        ``from torch.amp import GradScaler as Scaler``; else the written last name."""
        if isinstance(func, cst.Attribute):
            return func.attr.value  # a qualified name ends in the attribute as written
        if isinstance(func, cst.Name) and func.value not in self.aliases:
            return func.value  # not an alias: the name it resolves to ends in the name written
        for q in self.qnames(func):
            if q.startswith("torch."):
                return q.rsplit(".", 1)[1]
        if isinstance(func, cst.Name):
            return func.value
        return func.attr.value if isinstance(func, cst.Attribute) else None

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def in_fallback(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` sits in version- or feature-dependent code: under an ``if`` (or
        conditional expression) that tests the torch version or ``hasattr(torch...)``, or in an
        ``except AttributeError/TypeError/ImportError`` branch. Such code serves old torch on
        purpose; rewriting it to the new API breaks exactly the case it exists for."""
        seen: list[cst.CSTNode] = []
        child, parent, answer = node, self.parent(node), False
        while parent is not None:
            if child in self._fallback:
                answer = self._fallback[child]
                break
            seen.append(child)
            if isinstance(parent, (cst.If, cst.IfExp)) and _VERSION_TEST.search(self.code(parent.test)):
                answer = True
                break
            if isinstance(parent, cst.ExceptHandler) and child is parent.body and \
                    _catches_missing_api(parent.type):
                answer = True
                break
            child, parent = parent, self.parent(parent)
        for n in seen:  # every node on the way up has the same answer (memoised: asked per string)
            self._fallback[n] = answer
        return answer

    # the file's conventions
    @cached_property
    def torch_name(self) -> str | None:
        """The module-level name bound to ``torch`` (``torch``, or ``th`` for ``import torch as th``;
        ``torch`` when only a star import brings it)."""
        return self._imported_torch or ("torch" if self._star_torch else None)

    @cached_property
    def _imported_torch(self) -> str | None:
        names: list[str] = []
        module = self.module

        class _Imports(cst.CSTVisitor):
            # Imports inside a def or class bind local names only: not usable by module code.
            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return False

            def visit_ClassDef(self, node: cst.ClassDef) -> bool:
                return False

            def visit_Import(self, node: cst.Import) -> None:
                for alias in node.names:
                    full = module.code_for_node(alias.name)
                    if alias.asname is None and (full == "torch" or full.startswith("torch.")):
                        names.append("torch")
                    elif full == "torch" and isinstance(alias.asname.name, cst.Name):
                        names.append(alias.asname.name.value)

        self.walk([_Imports()])
        return "torch" if "torch" in names else (names[0] if names else None)

    @cached_property
    def quote(self) -> str:
        """The file's usual string quote, so inserted literals look like their neighbours: counted over the
        whole text (also what a partial parse left out), as libcst counts its SimpleString nodes."""
        double, single = quote_counts(self.source)
        return "'" if single > double else '"'

    def literal(self, value: str) -> str:
        return f"{self.quote}{value}{self.quote}"

    def retarget(self, device_type: str) -> str:
        """``cuda`` -> ``musa`` under ``--target musa`` (and the reverse); other types unchanged."""
        swap = VENDOR_SWAP.get(self.target)
        return swap[1] if swap and device_type == swap[0] else device_type

    # analyses, built on first use
    def analysis(self, build: Callable[["Context"], T]) -> T:
        """``build(self)``, computed once per file (the AMP references, the device resolver): the
        analyses import this module, never the reverse."""
        if build not in self._analyses:
            self._analyses[build] = build(self)
        return self._analyses[build]  # type: ignore[return-value]


def parse_musa_version(text: str) -> tuple[int, int] | None:
    """``"2.0.1"`` -> ``(2, 0)``; None when ``text`` is not a version."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:\.?(?:post|rc|dev)\d*)?", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _catches_missing_api(kind: cst.BaseExpression | None) -> bool:
    if kind is None:
        return False  # a bare except catches everything: not a deliberate API fallback
    names = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return any(isinstance(n, (cst.Name, cst.Attribute)) and
               (n.value if isinstance(n, cst.Name) else n.attr.value) in _FALLBACK_ERRORS for n in names)
