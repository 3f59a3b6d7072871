"""``clip-before-unscale``: ``clip_grad_norm_``/``clip_grad_value_`` after
``scaler.scale(loss).backward()`` and before ``scaler.unscale_(opt)`` in the same function.

The gradients still carry the loss scale (65536 at first), so the clip threshold means nothing.
Rewritten when the scaler and the optimizer (from ``scaler.step(opt)``) are unambiguous:
``scaler.unscale_(opt)`` is inserted on the line before the clip.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import dotted, last_name
from ampkit.migrate.rules.base import Rule

__all__ = ["ClipBeforeUnscaleRule"]

_CLIPS = ("clip_grad_norm_", "clip_grad_value_")


class ClipBeforeUnscaleRule(Rule):
    codes = ("clip-before-unscale",)
    tokens = (("clip_grad_",), (".scale",))

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._events: list[list[tuple]] = [[]]  # one event list per function, in source order

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._events.append([])

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._check(self._events.pop())

    def leave_Module(self, node: cst.Module) -> None:
        self._check(self._events.pop())

    def visit_Call(self, node: cst.Call) -> None:
        func, events = node.func, self._events[-1]
        name = last_name(func)
        if name == "backward" and isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call) \
                and last_name(func.value.func) == "scale" and isinstance(func.value.func, cst.Attribute):
            events.append(("backward", dotted(func.value.func.value)))
        elif name == "unscale_" and isinstance(func, cst.Attribute):
            events.append(("unscale", dotted(func.value)))
        elif name == "step" and isinstance(func, cst.Attribute) and len(node.args) == 1:
            events.append(("step", dotted(func.value), dotted(node.args[0].value)))
        elif name in _CLIPS:
            events.append(("clip", node))

    def _check(self, events: list[tuple]) -> None:
        pending: set[str | None] = set()
        for event in events:
            kind = event[0]
            if kind == "backward":
                pending.add(event[1])
            elif kind == "unscale":
                pending.discard(event[1])
            elif kind == "clip" and pending:
                self._report(event[1], pending, events)

    def _report(self, clip: cst.Call, pending: set[str | None], events: list[tuple]) -> None:
        scaler = next(iter(pending)) if len(pending) == 1 else None
        optimizers = {e[2] for e in events if e[0] == "step" and e[1] == scaler and scaler}
        opt = optimizers.pop() if len(optimizers) == 1 else None
        stmt = self.ctx.parent(self.ctx.parent(clip))  # Call -> Expr/Assign -> SimpleStatementLine
        fix = f"{scaler or 'scaler'}.unscale_({opt or 'optimizer'})  # before clipping"
        rewrite = opt is not None and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
        self.report(clip, "clip-before-unscale",
                    "gradients are clipped while still multiplied by the loss scale, so the clip "
                    "threshold is meaningless; unscale them first.", fix, rewritten=rewrite)
        if rewrite:
            line = cst.parse_statement(f"{scaler}.unscale_({opt})\n")

            def insert(u: cst.SimpleStatementLine) -> cst.FlattenSentinel:
                # Comments above the clip now sit above the inserted line.
                return cst.FlattenSentinel([line.with_changes(leading_lines=u.leading_lines),
                                            u.with_changes(leading_lines=())])

            self.replace(stmt, insert)
