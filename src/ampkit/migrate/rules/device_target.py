"""``--target musa`` / ``--target cuda``: move device-specific code to one vendor.

``"cuda"``/``"cuda:0"`` strings, ``.cuda()``, the ``torch.cuda.X`` runtime calls with a
``torch.musa`` twin, and ``"nccl"`` (and the reverse for ``--target cuda``, which also drops
``import torch_musa``). What cannot be moved safely (``.cuda(rank)``, a ``torch.cuda`` function
without a twin) is reported.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import dotted, prepend_arg, string_value
from ampkit.migrate.context import VENDOR_SWAP
from ampkit.migrate.device_resolve import device_type_of
from ampkit.migrate.rules.base import Rule

__all__ = ["DeviceTargetRule", "TWINS"]

# torch.cuda functions that torch.musa mirrors (MUSA.md).
TWINS = frozenset({
    "synchronize", "device_count", "is_available", "current_device", "set_device", "empty_cache",
    "max_memory_allocated", "memory_allocated", "reset_peak_memory_stats", "manual_seed",
    "manual_seed_all", "get_device_name", "get_device_properties", "get_device_capability",
    "Event", "Stream", "is_bf16_supported", "mem_get_info", "get_rng_state", "set_rng_state",
})
_BACKEND = {"musa": ("nccl", "mccl"), "cuda": ("mccl", "nccl")}


class DeviceTargetRule(Rule):
    codes = ()

    @classmethod
    def applies(cls, ctx) -> bool:
        return ctx.target in VENDOR_SWAP

    @classmethod
    def may_match(cls, text: str, target: str) -> bool:
        if target not in VENDOR_SWAP:
            return False
        src = VENDOR_SWAP[target][0]
        return src in text or _BACKEND[target][0] in text

    def visit_Module(self, node: cst.Module) -> None:
        self.src, self.dst = VENDOR_SWAP[self.ctx.target]
        self.backend = _BACKEND[self.ctx.target]

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if device_type_of(value) == self.src:
            new = self.dst + value[len(self.src):]
        elif value == self.backend[0]:
            new = self.backend[1]
        else:
            return
        self.replace(node, lambda u: u.with_changes(value=f"{u.prefix}{u.quote}{new}{u.quote}"))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # torch.cuda.synchronize -> torch.musa.synchronize
        inner = node.value
        if not (isinstance(inner, cst.Attribute) and inner.attr.value == self.src
                and "torch" in self.ctx.qnames(inner.value)):
            return
        if node.attr.value in TWINS:
            self.replace(node, lambda u: u.with_changes(value=u.value.with_changes(attr=cst.Name(self.dst))))
        elif node.attr.value != "amp":  # the amp rules handle torch.cuda.amp
            self.report(node, "deprecated-amp-api",
                        f"`{dotted(node)}` has no torch.{self.dst} twin that migrate knows; left as is.",
                        f"check torch.{self.dst} for an equivalent, or use the device-generic torch API")

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == self.src) \
                or "torch" in self.ctx.qnames(func.value):
            return
        positional = [a for a in node.args if a.keyword is None]
        device = self.ctx.literal(self.dst)
        if not positional and not any(a.keyword.value == "device" for a in node.args):
            self.replace(node, lambda u: prepend_arg(u.with_changes(func=u.func.with_changes(attr=cst.Name("to"))),
                                                     cst.Arg(cst.SimpleString(device))))
        elif len(positional) == 1 and isinstance(positional[0].value, cst.Integer) and not positional[0].star:
            index = positional[0].value.value
            literal = cst.SimpleString(self.ctx.literal(f"{self.dst}:{index}"))
            self.replace(node, lambda u: u.with_changes(
                func=u.func.with_changes(attr=cst.Name("to")),
                args=[u.args[0].with_changes(value=literal), *u.args[1:]]))
        else:
            self.report(node, "deprecated-amp-api",
                        f"`.{self.src}(...)` with a device argument was not rewritten for --target {self.dst}: "
                        "the argument may be an index or a device.",
                        f'.to(torch.device("{self.dst}", index))  # index: int')

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.dst != "cuda" or len(node.body) != 1 or not isinstance(node.body[0], cst.Import):
            return
        names = node.body[0].names
        keep = [a for a in names if dotted(a.name) != "torch_musa" or a.asname is not None]
        if len(keep) == len(names):
            return
        if not keep:  # CUDA machines have no torch_musa: the import would fail there
            self.replace(node, lambda u: cst.RemovalSentinel.REMOVE)
            return

        def drop(u: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
            imp = u.body[0]
            kept = [a for a in imp.names if dotted(a.name) != "torch_musa" or a.asname is not None]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return u.with_changes(body=[imp.with_changes(names=kept)])

        self.replace(node, drop)
