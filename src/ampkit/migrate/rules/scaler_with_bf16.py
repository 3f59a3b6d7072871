"""``scaler-with-bf16``: a GradScaler that is always enabled, in a function (or file) whose autocast
runs in bfloat16; or one made (or enabled) only under BF16: ``GradScaler() if use_bfloat16 else None``,
``if args.bf16: scaler = GradScaler()``, ``GradScaler(enabled=dtype == torch.bfloat16)``.

BF16 has FP32's exponent range: loss scaling buys nothing and costs a sync per step; a scaler made only
under BF16 is the FP16 recipe inverted, and FP16 then trains without one. Otherwise a scaler with
``enabled=<expression>`` is taken to be conditional and not reported. FSDP's and fairscale's
``ShardedGradScaler`` count as GradScalers.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import dotted, kwarg, string_value
from ampkit.migrate.rules._bf16_test import bf16_condition, fp16_only
from ampkit.migrate.rules.base import Rule

__all__ = ["ScalerWithBf16Rule"]

# torch's GradScaler, and the sharded ones for FSDP (torch.distributed.fsdp.sharded_grad_scaler) and fairscale
_SCALERS = frozenset({"GradScaler", "ShardedGradScaler"})


class ScalerWithBf16Rule(Rule):
    codes = ("scaler-with-bf16",)
    tokens = (("GradScaler",), ("bfloat16", "bf16", "BF16", "cpu"))
    keep = ("*GradScaler", "autocast")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._scope: list[cst.CSTNode] = []
        self._scalers: list[tuple[cst.CSTNode, cst.Call]] = []
        self._bf16: set[cst.CSTNode] = set()  # scopes with a bf16 autocast

    def visit_Module(self, node: cst.Module) -> None:
        self._scope.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.pop()

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.callee(node.func)
        if name in _SCALERS or name in self.ctx.aliases and self.ctx.aliases[name] & _SCALERS:
            condition = bf16_condition(self.ctx, node)
            if condition is not None:
                self._only_under_bf16(node, *condition)
            elif self._always_enabled(node):
                self._scalers.append((self._scope[-1], node))
        elif name == "autocast" and self._is_bf16(node):
            self._bf16.add(self._scope[-1])

    def leave_Module(self, node: cst.Module) -> None:
        module = self.ctx.module
        for scope, call in self._scalers:
            if scope in self._bf16 or module in self._bf16 or (scope is module and self._bf16):
                self.report(call, "scaler-with-bf16",
                            "this GradScaler is always enabled while autocast runs in bfloat16; BF16 "
                            "has FP32's exponent range, so scaling only adds work. Enable it for FP16 only.",
                            "scaler = torch.amp.GradScaler(device_type, enabled=(dtype == torch.float16))")

    def _only_under_bf16(self, call: cst.Call, condition: cst.BaseExpression, holds: bool) -> None:
        if not holds and isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.Not):
            condition, holds = condition.expression, True  # `None if not bf16 else Scaler()`: made when `bf16`
        test = self.ctx.code(condition).strip()
        if holds:
            when, inverted = f"when `{test}`", fp16_only(self.ctx, condition)
        else:
            when, inverted = f"when `{test}` is false", test
        scaler = self.ctx.code(call.func)
        self.report(call, "scaler-with-bf16",
                    f"this {scaler} is made (or enabled) only {when}, that is under BF16, where loss scaling "
                    "buys nothing; FP16, which needs it, then trains without one and small gradients underflow to "
                    "zero. The condition is inverted.",
                    f"make it for FP16 only: {scaler}(..., enabled={inverted})  # or: ... if {inverted} else None")

    @staticmethod
    def _always_enabled(call: cst.Call) -> bool:
        enabled = kwarg(call, "enabled")
        if enabled is not None:
            return dotted(enabled.value) == "True"
        return sum(1 for a in call.args if a.keyword is None) < 5  # enabled is never positional here

    def _is_bf16(self, call: cst.Call) -> bool:
        dtype = kwarg(call, "dtype")
        positional = [a for a in call.args if a.keyword is None]
        old_api = "amp.autocast" in (dotted(call.func) or "") and "torch.amp" not in (dotted(call.func) or "")
        if dtype is None and len(positional) >= 2:
            dtype = positional[1]  # (enabled, dtype) in the old API, (device_type, dtype) in the new
        if dtype is None:  # the cpu autocast defaults to bfloat16
            device = kwarg(call, "device_type") or (positional[0] if positional and not old_api else None)
            return ".cpu.amp." in f".{dotted(call.func)}." or (
                device is not None and string_value(device.value) == "cpu")
        return self._names_bf16(dtype.value)

    def _names_bf16(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Name):  # a parameter default or a local constant
            return self._resolve(value.value)
        return (dotted(value) or "").endswith("bfloat16")

    def _resolve(self, name: str) -> bool:
        scope = self._scope[-1]
        if not isinstance(scope, cst.FunctionDef):
            return False
        for p in (*scope.params.params, *scope.params.kwonly_params):
            if p.name.value == name and p.default is not None:
                return (dotted(p.default) or "").endswith("bfloat16")
        return False
