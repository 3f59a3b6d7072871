"""``host-sync-per-step``: ``.item()`` or ``if not torch.isfinite(...)`` in the body of a training
loop (a for/while whose own body calls ``.backward()``, steps the optimizer, or hands the loss to
a scaler helper such as timm's ``loss_scaler(loss, optimizer, ...)``).

Each one makes the host wait for the device every step, so the GPU idles while Python catches
up. The same call under ``if step % N == 0`` runs every N steps and is fine, and so is one on an
error path that ends the run (a block ending in ``raise`` or ``sys.exit``), and so is a CPU-only
script (one that runs on its own and names no accelerator or device at all): there is no device to wait for.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import dotted, last_name
from ampkit.migrate._walk import walk
from ampkit.migrate.rules.base import Rule

__all__ = ["HostSyncPerStepRule"]

_CHECKS = ("isfinite", "isnan", "isinf")
_HOST_MODULES = ("math", "np", "numpy", "cmath")
_ON_A_DEVICE = ("cuda", "musa", "device", "gpu", "GPU", "xpu", "mps", "npu", "ccelerat", "abric", "DataParallel",
                "scaler", "Scaler", "autocast")


class _Frame:
    def __init__(self, training: bool, step: str = "step") -> None:
        self.training = training
        self.step = step  # the loop's counter, for the fix hint
        self.guards = 0  # enclosing `if ... % N ...` bodies and error paths inside this loop


class _IsTrainingLoop(cst.CSTVisitor):
    """Whether a loop body itself (not a nested loop or def) calls ``.backward()`` or steps an
    optimizer (``scaler.step(opt)``, ``optimizer.step()``): with gradient accumulation the step,
    not the backward, marks the loop that runs once per training step."""

    found = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        receiver = (dotted(func.value) or "").lower()
        self.found |= func.attr.value == "backward" or (
            func.attr.value == "step" and (bool(node.args) or "opt" in receiver))

    def visit_Call_func(self, node: cst.Call) -> None:
        # loss_scaler(loss, optimizer, ...): a helper that scales, backpropagates and steps.
        name = last_name(node.func) or ""
        if "scaler" in name.lower() and name[:1].islower() and any(a.keyword is None for a in node.args):
            self.found = True

    def visit_For(self, node: cst.For) -> bool:
        return False

    def visit_While(self, node: cst.While) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def _has_modulo(node: cst.CSTNode) -> bool:
    class _Mod(cst.CSTVisitor):
        found = False

        def visit_Modulo(self, n: cst.Modulo) -> None:
            self.found = True

    finder = _Mod()
    walk(node, [finder])
    return finder.found


class HostSyncPerStepRule(Rule):
    codes = ("host-sync-per-step",)
    tokens = ((".item()", "isfinite(", "isnan(", "isinf("), (".backward(", ".step(", "scaler", "Scaler"))
    keep = ("item", "isfinite", "isnan", "isinf", "backward", "step", "*scaler*", "*Scaler*", "*SCALER*")
    reads_block_ends = True

    @classmethod
    def applies(cls, ctx) -> bool:
        # A CPU-only script (pytorch/examples' regression) has no device to wait for: a script (a loop at
        # module level, or `if __name__ == "__main__":`) that names no accelerator, device, launcher
        # framework or AMP scaler is not looked at. A module of functions may get its model and device
        # from another file, so it is.
        return any(word in ctx.source for word in _ON_A_DEVICE) or not _is_script(ctx.module)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._frames: list[_Frame] = []

    def _push_loop(self, node: cst.For | cst.While) -> None:
        finder = _IsTrainingLoop()
        walk(node.body, [finder])
        self._frames.append(_Frame(finder.found, _counter(node)))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if self._frames and _ends_the_run(node):
            self._frames[-1].guards += 1

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if self._frames and _ends_the_run(node):
            self._frames[-1].guards -= 1

    def visit_For_body(self, node: cst.For) -> None:
        self._push_loop(node)

    def leave_For_body(self, node: cst.For) -> None:
        self._frames.pop()

    def visit_While_body(self, node: cst.While) -> None:
        self._push_loop(node)

    def leave_While_body(self, node: cst.While) -> None:
        self._frames.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._frames.append(_Frame(False))  # a nested def is not run by the loop around it

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._frames.pop()

    def _per_step(self) -> bool:
        return bool(self._frames) and self._frames[-1].training and self._frames[-1].guards == 0

    def visit_If(self, node: cst.If) -> None:
        checked = self._checks_finite(node.test) if self._per_step() else None
        if checked is not None:
            self.report(node, "host-sync-per-step",
                        f"`if {self.ctx.code(node.test)}` reads a device value on the host every step, "
                        "which waits for the GPU. GradScaler already skips steps with inf/NaN gradients.",
                        f"bad_steps += (~torch.isfinite({checked})).sum()  # on the device; read it when you log")

    def visit_If_body(self, node: cst.If) -> None:
        if self._frames and _has_modulo(node.test):
            self._frames[-1].guards += 1

    def leave_If_body(self, node: cst.If) -> None:
        if self._frames and _has_modulo(node.test):
            self._frames[-1].guards -= 1

    def visit_Call(self, node: cst.Call) -> None:
        if last_name(node.func) == "item" and isinstance(node.func, cst.Attribute) and not node.args \
                and self._per_step():
            value, step = self.ctx.code(node.func.value), self._frames[-1].step
            self.report(node, "host-sync-per-step",
                        f"`{value}.item()` copies to the host every step, which "
                        "waits for the GPU. Accumulate on the device and read every N steps.",
                        f"running = running + {value}.detach()  # stays on the device\n"
                        f"if {step} % log_every == 0:\n    print((running / log_every).item()); running.zero_()")

    def _checks_finite(self, test: cst.BaseExpression) -> str | None:
        """The checked expression of a device-side isfinite/isnan/isinf call in ``test``."""
        found: list[str] = []
        code = self.ctx.code

        class _Find(cst.CSTVisitor):
            def visit_Call(self, n: cst.Call) -> None:
                name = dotted(n.func) or ""
                # math.isfinite / np.isfinite test host numbers: no device sync of their own.
                if last_name(n.func) in _CHECKS and name.split(".")[0] not in _HOST_MODULES:
                    found.append(code(n.args[0].value) if n.args else "loss")

        walk(test, [_Find()])
        return found[0] if found else None


def _is_script(module: cst.Module) -> bool:
    """The file runs on its own: a loop at module level, or an ``if __name__ == "__main__":`` block."""
    return any(isinstance(st, (cst.For, cst.While)) or
               isinstance(st, cst.If) and "__name__" in module.code_for_node(st.test) for st in module.body)


def _counter(loop: cst.For | cst.While) -> str:
    """The loop's step counter as the user named it: ``i`` in ``for i, (x, y) in enumerate(...)``."""
    target = loop.target if isinstance(loop, cst.For) else None
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        target = target.elements[0].value
    return target.value if isinstance(target, cst.Name) and target.value != "_" else "step"


def _ends_the_run(block: cst.IndentedBlock) -> bool:
    """The block ends in ``raise``, ``sys.exit(...)``, ``exit()``/``quit()`` or ``os._exit``: code in
    it runs once, on the way out, not every step."""
    last = block.body[-1] if block.body else None
    if not isinstance(last, cst.SimpleStatementLine) or not last.body:
        return False
    stmt = last.body[-1]
    if isinstance(stmt, cst.Raise):
        return True
    return isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call) and \
        dotted(stmt.value.func) in ("sys.exit", "exit", "quit", "os._exit")
