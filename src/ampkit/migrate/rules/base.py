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
from ampkit.migrate.device_resolve import DEVICE_NAMES
from ampkit.migrate.findings import Finding

__all__ = ["Rule", "Replacement", "OLD_AMP_TOKEN", "OLD_AMP_WORDS", "OLD_AMP_KEEP"]

# Every way of reaching torch.{cuda,cpu,musa}.amp spells "<vendor>.amp" (torch.cuda.amp.X,
# from torch.cuda.amp import X, import torch.cuda.amp as amp, cuda.amp.X) or imports `amp` from
# torch.<vendor> (from torch.cuda import amp).
OLD_AMP_WORDS = (("amp",), ("cuda", "cpu", "musa"))
OLD_AMP_TOKEN = r"(?:cuda|cpu|musa)\s*\.\s*amp\b|from\s+torch\s*\.\s*(?:cuda|cpu|musa)\s+import\b"

# What the deprecated-API rules read: the old namespace (names it binds count as words: skeleton.py), and
# the device variables the rewrite takes its device from.
OLD_AMP_KEEP = ("amp", *DEVICE_NAMES)

Replacement = Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel]


class Rule(cst.CSTVisitor):
    """Base class: subclasses set ``codes`` and override ``visit_*`` methods."""

    #: finding codes the rule emits; ``--select`` runs a rule when one of them is selected.
    #: Rules with no code (``--target`` rewrites) always run.
    codes: ClassVar[tuple[str, ...]] = ()
    #: a cheap pre-check, so files that cannot match are never parsed: groups of words, and the
    #: file's text must contain a word of EVERY group (plain substring tests, fast on megabytes).
    #: Keep them a superset of what the visitor matches (a test runs each rule on its fixtures).
    tokens: ClassVar[tuple[tuple[str, ...], ...]] = ()
    #: an optional regular expression that must also match, tried only when the words are there.
    pattern: ClassVar[str | None] = None
    #: the words a statement must hold for the rule to look at it: the partial parse (skeleton.py) leaves
    #: other statements out of the tree. A word is a whole word (``step`` is not in ``global_step``); a ``*``
    #: at an end leaves that end open (``*cuda*`` is in ``is_cuda``, ``clip_grad_*`` in ``clip_grad_norm_``).
    #: None: the rule needs the whole file. More words are always right; a statement the rule reads that
    #: holds none is a bug (tests run every fixture both ways and compare).
    keep: ClassVar[tuple[str, ...] | None] = None
    #: the rule reads whether a block ends the run (its last statement a ``raise`` or ``sys.exit``)
    reads_block_ends: ClassVar[bool] = False

    @classmethod
    def keep_words(cls, code: str) -> tuple[str, ...]:
        """Names that count as ``keep`` words in this file (a local bound to something the rule follows)."""
        return ()

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
        if not all(any(word in text for word in group) for group in cls.tokens):
            return False
        return cls.pattern is None or _compiled(cls.pattern).search(text) is not None

    def report(self, node: cst.CSTNode, code: str, message: str, fix: str, *, rewritten: bool = False,
               kind: str = "") -> None:
        self.findings.append(Finding(code=code, message=message, path=self.ctx.filename,
                                     line=self.ctx.line(node), fix=fix, rewritten=rewritten, kind=kind))

    def replace(self, node: cst.CSTNode, fn: Replacement) -> None:
        self.replacements.append((node, fn))


@lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)
