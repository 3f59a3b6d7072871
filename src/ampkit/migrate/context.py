"""Per-file state the rules share: metadata look-ups, the target, and lazily built analyses."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

if TYPE_CHECKING:
    from ampkit.migrate.amp_refs import AmpRefs
    from ampkit.migrate.device_resolve import DeviceResolver

__all__ = ["Context", "TARGETS", "VENDOR_SWAP"]

TARGETS = ("agnostic", "cuda", "musa")
# target -> (vendor rewritten away, vendor written); "agnostic" swaps nothing.
VENDOR_SWAP = {"musa": ("cuda", "musa"), "cuda": ("musa", "cuda")}


class Context:
    """Everything a rule may ask about the file being migrated. Built once per file."""

    def __init__(self, wrapper: MetadataWrapper, *, target: str, filename: str) -> None:
        self.wrapper = wrapper
        self.module = wrapper.module
        self.target = target
        self.filename = filename

    # Resolved on first use: the scope analysis behind qualified names costs more than parsing,
    # and a file that only the name-free rules look at never pays for it.
    @cached_property
    def _pos(self):
        return self.wrapper.resolve(PositionProvider)

    @cached_property
    def _parents(self):
        return self.wrapper.resolve(ParentNodeProvider)

    @cached_property
    def _qn(self):
        return self.wrapper.resolve(QualifiedNameProvider)

    # metadata
    def line(self, node: cst.CSTNode) -> int:
        return self._pos[node].start.line

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def qnames(self, node: cst.CSTNode) -> set[str]:
        value = self._qn.get(node)
        if value is None:
            return set()
        if callable(value):  # libcst hands out qualified names lazily
            value = value()
        return {q.name for q in value}

    def callee(self, func: cst.BaseExpression) -> str | None:
        """The name a call really calls: ``GradScaler`` for ``Scaler()`` after
        ``from torch.amp import GradScaler as Scaler``; else the written last name."""
        for q in self.qnames(func):
            if q.startswith("torch."):
                return q.rsplit(".", 1)[1]
        if isinstance(func, cst.Name):
            return func.value
        return func.attr.value if isinstance(func, cst.Attribute) else None

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # the file's conventions
    @cached_property
    def torch_name(self) -> str | None:
        """The module-level name bound to ``torch`` (``torch``, or ``th`` for ``import torch as th``)."""
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

        module.visit(_Imports())
        return "torch" if "torch" in names else (names[0] if names else None)

    @cached_property
    def quote(self) -> str:
        """The file's usual string quote, so inserted literals look like their neighbours."""
        counts = {'"': 0, "'": 0}

        class _Count(cst.CSTVisitor):
            def visit_SimpleString(self, node: cst.SimpleString) -> None:
                if node.quote in counts:
                    counts[node.quote] += 1

        self.module.visit(_Count())
        return "'" if counts["'"] > counts['"'] else '"'

    def literal(self, value: str) -> str:
        return f"{self.quote}{value}{self.quote}"

    def retarget(self, device_type: str) -> str:
        """``cuda`` -> ``musa`` under ``--target musa`` (and the reverse); other types unchanged."""
        swap = VENDOR_SWAP.get(self.target)
        return swap[1] if swap and device_type == swap[0] else device_type

    # analyses, built on first use
    @cached_property
    def amp_refs(self) -> "AmpRefs":
        from ampkit.migrate.amp_refs import analyse

        return analyse(self)

    @cached_property
    def devices(self) -> "DeviceResolver":
        from ampkit.migrate.device_resolve import DeviceResolver

        return DeviceResolver(self)

