"""The contract every rule follows.

A rule is a libcst visitor over the *original* tree (so line numbers are the user's). It reports
findings and may register replacements: a function from the already-updated node to its new form.
The engine applies all replacements in one transform, so rules compose (a "cuda" string inside an
autocast call that another rule rewrites is still retargeted).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, ClassVar

import libcst as cst

from ampkit.migrate.context import Context
from ampkit.migrate.findings import Finding

__all__ = ["Rule", "Replacement"]

Replacement = Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel]


class Rule(cst.CSTVisitor):
    """Base class: subclasses set ``codes`` and override ``visit_*`` methods."""

    #: finding codes the rule emits; ``--select`` runs a rule when one of them is selected.
    #: Rules with no code (``--target`` rewrites) always run.
    codes: ClassVar[tuple[str, ...]] = ()
    #: regular expressions that must ALL occur in a file's text for the rule to find anything:
    #: a cheap pre-check, so files that cannot match are never parsed. Keep them a superset of
    #: what the visitor matches (a test checks each rule against its fixtures).
    tokens: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx
        self.findings: list[Finding] = []
        self.replacements: list[tuple[cst.CSTNode, Replacement]] = []

    @classmethod
    def applies(cls, ctx: Context) -> bool:
        """False to skip the rule for this file or target."""
        return True

    @classmethod
    def may_match(cls, text: str, target: str) -> bool:
        """False when ``text`` lacks a token the rule needs: it cannot report or rewrite anything."""
        return all(p.search(text) for p in _compiled(cls.tokens))

    def report(self, node: cst.CSTNode, code: str, message: str, fix: str, *, rewritten: bool = False) -> None:
        self.findings.append(Finding(code=code, message=message, path=self.ctx.filename,
                                     line=self.ctx.line(node), fix=fix, rewritten=rewritten))

    def replace(self, node: cst.CSTNode, fn: Replacement) -> None:
        self.replacements.append((node, fn))


@lru_cache(maxsize=None)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)
