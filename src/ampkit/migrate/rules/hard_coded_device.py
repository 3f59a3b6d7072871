"""``hard-coded-device``: a ``torch.amp`` call whose device is a vendor literal (``"cuda"``) where
no device variable is visible, so the code runs on that vendor only; and a ``torch.amp.GradScaler``
given no device at all, which is a "cuda" scaler wherever the model runs.

The reminder that the deprecated-API rewrite gives (``torch.cuda.amp.autocast()`` became
``torch.amp.autocast("cuda")``) stays after ``--fix``: this rule finds the rewritten call. Only
under ``--target agnostic``: ``--target musa|cuda`` asks for one vendor on purpose. Code in a
version/feature fallback is left alone.
"""

from __future__ import annotations

import libcst as cst

from ampkit.migrate._cst import kwarg, prepend_arg, string_value
from ampkit.migrate.device_resolve import ACCELERATORS, DEVICE_NAMES, device_type_of, devices_of
from ampkit.migrate.rules._amp import SCALERS, scaler_without_device
from ampkit.migrate.rules.base import Rule

__all__ = ["HardCodedDeviceRule"]

_NEW_API = {"torch.amp.autocast", "torch.autocast", "torch.amp.autocast_mode.autocast", *SCALERS,
            "torch.amp.custom_fwd", "torch.amp.custom_bwd", "torch.amp.autocast_mode.custom_fwd",
            "torch.amp.autocast_mode.custom_bwd"}
_NEW_NAMES = tuple({name.rsplit(".", 1)[1] for name in _NEW_API})


class HardCodedDeviceRule(Rule):
    codes = ("hard-coded-device",)
    tokens = (("autocast", "GradScaler", "custom_fwd", "custom_bwd"), ("cuda", "musa", "GradScaler"))
    keep = ("autocast", "GradScaler", "custom_fwd", "custom_bwd", *DEVICE_NAMES)

    @classmethod
    def may_match(cls, text: str, target: str) -> bool:
        return target == "agnostic" and super().may_match(text, target)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.maybe(node.func, *_NEW_NAMES) or not _NEW_API.intersection(self.ctx.qnames(node.func)):
            return
        if scaler_without_device(self, node):
            if not self.ctx.in_fallback(node):
                self._scaler_without_device(node)
            return
        arg = kwarg(node, "device_type") or kwarg(node, "device")
        if arg is None and node.args and node.args[0].keyword is None and not node.args[0].star:
            arg = node.args[0]
        vendor = device_type_of(string_value(arg.value)) if arg is not None else None
        if vendor not in ACCELERATORS or self.ctx.in_fallback(node):
            return
        if devices_of(self.ctx).visible(node, vendor) is not None:
            return  # the file has a device variable here; using the literal is a choice, not a gap
        example = node.with_changes(args=[a.with_changes(value=cst.Name("device_type")) if a is arg else a
                                          for a in node.args])
        self.report(node, "hard-coded-device",
                    f'the device is hard-coded to "{vendor}" and no device_type/device variable is visible '
                    f"here, so this runs on {vendor} only. Pass the device in.",
                    f'{self.ctx.code(example)}  # device_type: "cuda", "musa" or "cpu", passed in')

    def _scaler_without_device(self, node: cst.Call) -> None:
        """``torch.amp.GradScaler()`` given no device is a "cuda" scaler, whatever device the model is on: where
        CUDA is absent (a MUSA card) it disables itself with a warning, and FP16 trains without loss scaling."""
        choice = devices_of(self.ctx).visible(node, "cuda")  # the device variable in scope, as a rewrite would use it
        fix = prepend_arg(node, cst.Arg(cst.parse_expression(choice.code if choice is not None else "device_type")))
        self.report(node, "hard-coded-device",
                    "this GradScaler is given no device, so it is a \"cuda\" scaler: on another device (a MUSA card) "
                    "it disables itself with a warning and FP16 trains without loss scaling. Pass the device in.",
                    f"{self.ctx.code(fix)}  # device_type: the model's device type")
