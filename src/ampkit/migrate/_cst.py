"""Small libcst helpers shared by the rules: dotted names, argument lists, literals."""

from __future__ import annotations

import libcst as cst

__all__ = [
    "dotted",
    "last_name",
    "kwarg",
    "keyword_arg",
    "prepend_arg",
    "append_arg",
    "string_value",
    "expr",
]

_NO_SPACE = cst.SimpleWhitespace("")


def dotted(node: cst.CSTNode | None) -> str | None:
    """``torch.cuda.amp.autocast`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def last_name(node: cst.CSTNode) -> str | None:
    """The called name without its receiver: ``clip_grad_norm_`` for ``nn.utils.clip_grad_norm_``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    """The ``name=...`` argument of a call, if any."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value`` with no spaces around ``=`` (PEP 8 for keyword arguments)."""
    return cst.Arg(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
        value=value,
    )


def _separator(call: cst.Call) -> cst.Comma:
    # Multi-line argument lists keep one argument per line: reuse the call's own line break.
    ws = call.whitespace_before_args
    if isinstance(ws, cst.ParenthesizedWhitespace):  # the line break and indent, not its comment
        return cst.Comma(whitespace_after=ws.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=()))
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def prepend_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    """Insert ``arg`` as the first argument, keeping the layout of the others."""
    if not call.args:
        return call.with_changes(args=[arg])
    return call.with_changes(args=[arg.with_changes(comma=_separator(call)), *call.args])


def append_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    """Add ``arg`` after the last argument, keeping a trailing comma and line breaks if present."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[arg])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: the new argument takes it over
        sep = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else _separator(call)
        args[-1] = last.with_changes(comma=sep)
        args.append(arg.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                     whitespace_after_arg=_NO_SPACE)
        args.append(arg.with_changes(whitespace_after_arg=last.whitespace_after_arg))
    return call.with_changes(args=args)


def string_value(node: cst.CSTNode | None) -> str | None:
    """The value of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        raw = node.raw_value
        if "\\" not in raw and "\r" not in raw:  # nothing to unescape: what literal_eval would give, without a parse
            return raw
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def expr(code: str) -> cst.BaseExpression:
    """Parse a small expression written by a rule."""
    return cst.parse_expression(code)
