"""Whether a condition holds exactly when the run is in BF16, read from the code that states it.

``scaler-with-bf16`` asks it of the conditions a GradScaler is made under: ``GradScaler() if use_bfloat16
else None``, ``if args.bf16: scaler = ...``, ``GradScaler(enabled=dtype == torch.bfloat16)``. Each is the
FP16 recipe inverted: the scaler exists where it buys nothing and is missing where FP16 needs it.
"""

from __future__ import annotations

import re

import libcst as cst

from ampkit.migrate._cst import dotted, kwarg, string_value

__all__ = ["bf16_polarity", "bf16_condition", "fp16_only"]

_BF16 = re.compile(r"b(?:f|float)_?16", re.IGNORECASE)
# FP16 words (not the "float16" inside "bfloat16"), and the Lightning names "16-mixed" / "16" for FP16.
_FP16 = re.compile(r"fp_?16|(?<!b)float_?16|half|^16(?:-mixed)?$", re.IGNORECASE)
# a flag that says the opposite: no_bf16, disable_bf16, without_bf16
_NEGATED = re.compile(r"(?:^|[._])(?:no|not|disable|disabled|without)_", re.IGNORECASE)
_SAME = (cst.Equal, cst.Is, cst.In)
_OTHER = (cst.NotEqual, cst.IsNot, cst.NotIn)


def _leaf(node: cst.BaseExpression) -> int:
    """+1 for a name or string that says BF16 (``args.bf16``, ``torch.bfloat16``, ``"bf16-mixed"``), -1 for
    one that negates it (``args.no_bf16``), 0 for anything else (FP16 names included)."""
    text = string_value(node)
    if text is None:
        text = dotted(node)
    if text is None or not _BF16.search(text) or _FP16.search(_BF16.sub("", text)):
        return 0
    return -1 if _NEGATED.search(text) else 1


def _side(node: cst.BaseExpression) -> int:
    """A comparison's side: a leaf, or a tuple/list/set of leaves that all say BF16 (``in ("bf16", "bf16-true")``)."""
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        marks = [_leaf(e.value) for e in node.elements]
        return 1 if marks and all(m == 1 for m in marks) else 0
    return _leaf(node)


def _falsy(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False" or \
        isinstance(node, cst.Integer) and node.value == "0"


def bf16_polarity(test: cst.BaseExpression) -> int:
    """+1 when ``test`` is true exactly under BF16 (or only under it), -1 when it is true only outside BF16, 0
    when the code does not say."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return -bf16_polarity(test.expression)
    if isinstance(test, cst.BooleanOperation):
        left, right = bf16_polarity(test.left), bf16_polarity(test.right)
        if isinstance(test.operator, cst.And):  # both must hold: one BF16-only part makes it BF16-only
            return -1 if -1 in (left, right) else (1 if 1 in (left, right) else 0)
        return left if left == right else 0  # `fp16 or bf16`: either
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        left, right = test.left, target.comparator
        mark = _side(left) or _side(right)
        if _leaf(left) and _leaf(right) or not mark:
            return 0
        other = right if _side(left) else left
        if _falsy(other):
            mark = -mark
        if isinstance(target.operator, _SAME):
            return mark
        return -mark if isinstance(target.operator, _OTHER) else 0
    if isinstance(test, (cst.Name, cst.Attribute)):
        return _leaf(test)
    return 0


def bf16_condition(ctx, call: cst.Call) -> tuple[cst.BaseExpression, bool] | None:
    """The condition that makes ``call`` (a GradScaler) exist or be enabled only under BF16, or None: its
    ``enabled=``, a conditional expression around it, or an ``if``/``elif``/``else`` it is made in; with
    True when the scaler exists where the condition holds, False where it does not (an ``else``)."""
    enabled = kwarg(call, "enabled")
    if enabled is not None and bf16_polarity(enabled.value) == 1:
        return enabled.value, True
    child, parent = call, ctx.parent(call)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)):
        branch = None
        if isinstance(parent, cst.IfExp) and child is not parent.test:
            branch = 1 if child is parent.body else -1
        elif isinstance(parent, cst.If) and child is not parent.test:
            branch = 1 if child is parent.body else -1  # the else block, or an elif (an If in orelse)
        if branch is not None and bf16_polarity(parent.test) * branch == 1:
            return parent.test, branch == 1
        child, parent = parent, ctx.parent(parent)
    return None


_SWAP = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
         cst.In: cst.NotIn, cst.NotIn: cst.In}


def fp16_only(ctx, test: cst.BaseExpression) -> str:
    """``test`` (true under BF16) turned into the condition for FP16, as the user's code would say it:
    ``not use_bf16``, ``dtype != torch.bfloat16``, ``cfg["amp"] and not use_bf16``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return ctx.code(test.expression).strip()
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = bf16_polarity(test.left), bf16_polarity(test.right)
        if left == 1 and right != 1:
            return f"{ctx.code(test.right).strip()} and {fp16_only(ctx, test.left)}"
        if right == 1 and left != 1:
            return f"{ctx.code(test.left).strip()} and {fp16_only(ctx, test.right)}"
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        swapped = _SWAP.get(type(target.operator))
        if swapped is not None:
            op = target.operator
            new = swapped(whitespace_before=op.whitespace_before, whitespace_after=op.whitespace_after) \
                if swapped in (cst.Equal, cst.NotEqual) else swapped()
            return ctx.code(test.with_changes(comparisons=[target.with_changes(operator=new)])).strip()
    text = ctx.code(test).strip()
    return f"not {text}" if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) else f"not ({text})"
