"""``clip-before-unscale``: ``clip_grad_norm_``/``clip_grad_value_`` after
``scaler.scale(loss).backward()`` and before ``scaler.unscale_(opt)`` on the same path through a function.

The gradients still carry the loss scale (65536 at first), so the clip threshold means nothing.
"On the same path": a clip in the ``else`` of an ``if use_amp:`` whose ``if`` branch holds the scaled
backward is the FP32 loop, with no scaler, and is not reported. Rewritten when the scaler and the
optimizer (from ``scaler.step(opt)``) are unambiguous and the clip runs under at least the conditions
the scaled backward runs under (so the scaler exists there): a later ``scaler.unscale_(opt)`` in the
same block is moved before the clip (calling it twice raises at run time); else
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
    keep = ("clip_grad_*", "scale", "unscale_", "step", "backward")

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
            events.append(("backward", dotted(func.value.func.value), self._path(node), node))
        elif name == "unscale_" and isinstance(func, cst.Attribute):
            events.append(("unscale", dotted(func.value), self._path(node), node))
        elif name == "step" and isinstance(func, cst.Attribute) and len(node.args) == 1:
            events.append(("step", dotted(func.value), dotted(node.args[0].value)))
        elif name in _CLIPS:
            events.append(("clip", None, self._path(node), node))

    def _path(self, node: cst.CSTNode) -> tuple[tuple[cst.If, int], ...]:
        """The ``if`` branches around ``node`` in its function: (the ``if``, 0 for its body, 1 for the rest)."""
        path = []
        child, parent = node, self.ctx.parent(node)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            if isinstance(parent, cst.If) and child is not parent.test:
                path.append((parent, 0 if child is parent.body else 1))
            child, parent = parent, self.ctx.parent(parent)
        return tuple(reversed(path))

    def _check(self, events: list[tuple]) -> None:
        pending: list[tuple] = []  # scaled backward calls not yet unscaled
        for i, event in enumerate(events):
            kind = event[0]
            if kind == "backward":
                pending.append(event)
            elif kind == "unscale":
                pending = [b for b in pending if not (b[1] == event[1] and _compatible(b[2], event[2]))]
            elif kind == "clip":
                before = [b for b in pending if _compatible(b[2], event[2])]
                if before:
                    self._report(event, before, events[i + 1:], events)

    def _report(self, clip: tuple, before: list[tuple], after: list[tuple], events: list[tuple]) -> None:
        scalers = {b[1] for b in before}
        scaler = next(iter(scalers)) if len(scalers) == 1 else None
        optimizers = {e[2] for e in events if e[0] == "step" and e[1] == scaler and scaler}
        opt = optimizers.pop() if len(optimizers) == 1 else None
        call = clip[3]
        stmt = self.ctx.parent(self.ctx.parent(call))  # Call -> Expr/Assign -> SimpleStatementLine
        # the scaler exists wherever the clip runs: every branch the backward is in, the clip is in too
        covered = all(set(b[2]) <= set(clip[2]) for b in before)
        rewrite = opt is not None and covered and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
        later = self._later_unscale(stmt, clip, scaler, after) if rewrite else None
        if later is not None:
            fix = f"move {self.ctx.code(later.body[0]).strip()} above the clip  # once, before clipping"
        else:
            fix = f"{scaler or 'scaler'}.unscale_({opt or 'optimizer'})  # before clipping"
        self.report(call, "clip-before-unscale",
                    "gradients are clipped while still multiplied by the loss scale, so the clip "
                    "threshold is meaningless; unscale them first.", fix, rewritten=rewrite)
        if not rewrite:
            return
        if later is not None:
            line = later.with_changes(leading_lines=())
            self.replace(later, lambda u: cst.RemovalSentinel.REMOVE)
        else:
            line = cst.parse_statement(f"{scaler}.unscale_({opt})\n")

        def insert(u: cst.SimpleStatementLine) -> cst.FlattenSentinel:
            # Comments above the clip now sit above the inserted line.
            return cst.FlattenSentinel([line.with_changes(leading_lines=u.leading_lines),
                                        u.with_changes(leading_lines=())])

        self.replace(stmt, insert)

    def _later_unscale(self, stmt: cst.CSTNode, clip: tuple, scaler: str | None,
                       after: list[tuple]) -> cst.SimpleStatementLine | None:
        """The script's own ``scaler.unscale_(...)`` after the clip, alone on its line in the clip's
        block: moved instead of adding a second one."""
        for event in after:
            if event[0] != "unscale" or event[1] != scaler or not _compatible(event[2], clip[2]):
                continue
            line = self.ctx.parent(self.ctx.parent(event[3]))
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and \
                    isinstance(line.body[0], cst.Expr) and self.ctx.parent(line) is self.ctx.parent(stmt):
                return line
            return None
        return None


def _compatible(a: tuple, b: tuple) -> bool:
    """Two branch paths one run can take both of: no ``if`` where they take different branches."""
    branches = dict(a)
    return all(branches.get(node, side) == side for node, side in b)
