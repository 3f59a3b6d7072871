"""Run the rules over one source string: parse, lint, rewrite, check the result parses."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from ampkit.errors import AmpkitError, UsageError, first_line
from ampkit.migrate._text import STAR_IMPORT
from ampkit.migrate.context import DEFAULT_MUSA_VERSION, TARGETS, Context, parse_musa_version
from ampkit.migrate.findings import CODES, Finding
from ampkit.migrate.rules import RULES
from ampkit.migrate.rules.base import Replacement
from ampkit.migrate import skeleton as _skeleton

__all__ = ["MigrateResult", "SourceSyntaxError", "migrate_source", "check_options", "may_match", "musa_version_of"]


class SourceSyntaxError(UsageError):
    """The input does not parse; it is reported and never written."""


@dataclass(frozen=True)
class MigrateResult:
    """``new_code`` equals the input when ``changed`` is False."""

    new_code: str
    findings: tuple[Finding, ...]
    changed: bool


def check_options(target: str, select: Iterable[str] | None) -> frozenset[str] | None:
    """Validate ``target`` and ``select``; returns the selected codes (None: all)."""
    if target not in TARGETS:
        raise UsageError(f"unknown --target {target!r}; choose one of {', '.join(TARGETS)}")
    if select is None:
        return None
    codes = frozenset(select)
    if not codes:
        raise UsageError(f"--select names no code; give one or more of {', '.join(CODES)} (or leave it out)")
    unknown = sorted(codes - set(CODES))
    if unknown:
        raise UsageError(f"unknown code(s) {', '.join(unknown)} in --select; known: {', '.join(CODES)}")
    return codes


def _rules(code: str, target: str, selected: frozenset[str] | None) -> list[type]:
    return [r for r in RULES
            if (selected is None or not r.codes or selected.intersection(r.codes)) and r.may_match(code, target)]


def may_match(code: str, *, target: str = "agnostic", select: Iterable[str] | None = None) -> bool:
    """Whether any rule could find something in ``code`` (a regex pre-check, no parse).

    >>> may_match("import os\nprint(os.sep)\n")
    False
    """
    return bool(_rules(code, target, check_options(target, select)))


def _compile(code: str | ast.Module, filename: str) -> None:
    with warnings.catch_warnings():  # invalid escape sequences and the like are not our business
        warnings.simplefilter("ignore")
        compile(code, filename, "exec", dont_inherit=True)


def _syntax_error(exc: SyntaxError, filename: str) -> SourceSyntaxError:
    where = f"{filename}:{exc.lineno}" if exc.lineno is not None else filename  # a NUL byte has no line
    return SourceSyntaxError(f"{where}: does not parse ({exc.msg}); left untouched")


def _check(code: str, filename: str) -> ast.Module:
    """Python's own parse of ``code`` (the interpreter is the judge of "parses"; libcst accepts a little more)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code, filename)
        _compile(tree, filename)  # what the compiler checks beyond the grammar (`return` outside a def ...)
    except SyntaxError as exc:
        raise _syntax_error(exc, filename) from None
    return tree


def _libcst(code: str, filename: str) -> cst.Module:
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as exc:  # Python compiles it, libcst does not: a libcst limit
        raise AmpkitError(f"{filename}:{exc.raw_line}: libcst cannot parse it ({exc.message}); Python "
                          "can, so this is a libcst limit (deep nesting or newer syntax); left untouched") from None


class _Apply(cst.CSTTransformer):
    """Applies the rules' replacements to the nodes they registered, innermost first. Only the paths
    from the module down to a replaced node are rebuilt; every other subtree is kept as it is."""

    def __init__(self, replacements: dict[cst.CSTNode, list[Replacement]], parent) -> None:
        super().__init__()
        self.replacements = replacements
        self.on_path: set[cst.CSTNode] = set()
        for node in replacements:
            while node is not None and node not in self.on_path:
                self.on_path.add(node)
                node = parent(node)

    def on_visit(self, node) -> bool:
        return node in self.on_path

    def on_visit_attribute(self, node, attribute) -> None:
        return None

    def on_leave_attribute(self, original_node, attribute) -> None:
        return None

    def on_leave(self, original_node, updated_node):
        for fn in self.replacements.get(original_node, ()):
            if not isinstance(updated_node, cst.CSTNode):
                break  # removed or split by an earlier rule: nothing left to rewrite
            updated_node = fn(updated_node)
        return updated_node


def musa_version_of(text: str | None) -> tuple[int, int]:
    """``--musa-version`` -> ``(major, minor)``; the default (:data:`DEFAULT_MUSA_VERSION`) for None."""
    if text is None:
        return DEFAULT_MUSA_VERSION
    version = parse_musa_version(text)
    if version is None:
        raise UsageError(f"--musa-version {text!r} is not a version; give the torch_musa release, e.g. 2.0 or 2.7.1")
    return version


def migrate_source(code: str, *, target: str = "agnostic", select: Iterable[str] | None = None,
                   filename: str = "<string>", musa_version: str | None = None) -> MigrateResult:
    """Migrate one module's source.

    >>> r = migrate_source("import torch\\ns = torch.cuda.amp.GradScaler()\\n")
    >>> r.new_code.splitlines()[1]
    's = torch.amp.GradScaler("cuda")'

    Raises :class:`SourceSyntaxError` (a :class:`~ampkit.errors.UsageError`) when ``code`` does
    not parse, and :class:`~ampkit.errors.AmpkitError` when it is too deep or big to analyse (or a
    rule fails on it); the message is one line that names the file.
    """
    selected = check_options(target, select)
    version = musa_version_of(musa_version)
    try:
        return _migrate(code, target, selected, filename, version)
    except RecursionError:
        # Python's own compiler, libcst's metadata and the visitors all recurse per nesting level;
        # a long chain of implicitly concatenated strings (pydoc_data/topics.py) is enough.
        raise AmpkitError(f"{filename}: nested too deeply to analyse (RecursionError); left untouched") from None
    except MemoryError:
        raise AmpkitError(f"{filename}: out of memory while analysing; left untouched") from None


def _migrate(code: str, target: str, selected: frozenset[str] | None, filename: str,
             musa_version: tuple[int, int] = DEFAULT_MUSA_VERSION, *, partial: bool = True) -> MigrateResult:
    # libcst drops a final lone "\r" (an old Mac line end) that Python reads as a newline: keep it aside.
    tail = "\r" if code.endswith("\r") else ""
    code = code[: len(code) - len(tail)]
    rules = _rules(code, target, selected)
    tree = _check(code, filename)
    skeleton = _skeleton_for(code, tree, rules) if partial else None
    if skeleton is not None:
        try:
            module = cst.parse_module(skeleton.text)
        except cst.ParserSyntaxError:
            skeleton = None  # a layout the skeleton does not reproduce: analyse the whole file
    if skeleton is None:
        module = _libcst(code, filename)
    ctx = Context(module, target=target, filename=filename, source=code, musa_version=musa_version)
    findings: list[Finding] = []
    replacements: dict[cst.CSTNode, list[Replacement]] = {}
    active = [rule_cls(ctx) for rule_cls in rules if rule_cls.applies(ctx)]
    try:
        ctx.walk(active)  # one pass over the tree for every rule
    except (RecursionError, MemoryError):
        raise  # the file is too big or deep for the analysis, not a rule bug: the caller says so
    except Exception as exc:  # a rule bug must not become a traceback or a half-written file
        raise AmpkitError(f"{filename}: internal error in {_culprit(exc, active)} ({first_line(exc, 200)}); "
                          "file left untouched. Please report this with the file.") from exc
    for rule in active:
        findings.extend(f for f in rule.findings if selected is None or f.code in selected)
        for node, fn in rule.replacements:
            replacements.setdefault(node, []).append(fn)
    try:
        new_code = module.visit(_Apply(replacements, ctx.parent)).code if replacements else code
    except (RecursionError, MemoryError):
        raise
    except Exception as exc:
        raise AmpkitError(f"{filename}: internal error while rewriting ({first_line(exc, 200)}); "
                          "file left untouched. Please report this with the file.") from exc
    if replacements and skeleton is not None:
        new_code = _skeleton.splice(new_code, skeleton)
        if new_code is None:  # a rewrite moved a placeholder: do it again on the whole file
            return _migrate(code + tail, target, selected, filename, musa_version, partial=False)
    if new_code != code:
        try:
            _compile(new_code, filename)
        except SyntaxError as exc:  # a rule bug: never hand out code that does not run
            raise AmpkitError(f"{filename}: migrate produced code that does not parse ({exc.msg} at line "
                              f"{exc.lineno}); nothing written. Please report this with the file.") from None
    return MigrateResult(new_code + tail, _dedupe(findings), new_code != code)


def _skeleton_for(code: str, tree: ast.Module, rules: list[type]) -> _skeleton.Skeleton | None:
    """The partial parse for these rules, or None where some rule needs the whole file (its ``keep`` is
    None) or torch may come through a star import."""
    if not rules or any(r.keep is None for r in rules) or STAR_IMPORT.search(code):
        return None
    words = {w for r in rules for w in r.keep} | {w for r in rules for w in r.keep_words(code)}
    return _skeleton.build(code, tree, sorted(words), block_ends=any(r.reads_block_ends for r in rules))


def _culprit(exc: BaseException, rules: list) -> str:
    """The rule whose code raised ``exc`` (the innermost frame whose ``self`` is one of ``rules``)."""
    names = "a rule"
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if any(owner is r for r in rules):
            names = type(owner).__name__
        tb = tb.tb_next
    return names


def _dedupe(findings: list[Finding]) -> tuple[Finding, ...]:
    seen: dict[tuple[int, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.line, f.code), f)
    return tuple(sorted(seen.values(), key=lambda f: (f.line, f.code)))
