"""What the autocast, GradScaler and custom_fwd rules share: the new callee and the device."""

from __future__ import annotations

import libcst as cst

from ampkit.migrate.amp_refs import AmpRef, refs_of
from ampkit.migrate.device_resolve import DeviceChoice
from ampkit.migrate.rules.base import Rule

__all__ = ["new_callee", "amp_refs_for", "report_fallback", "SCALERS", "scaler_without_device"]

# torch.amp.GradScaler under its names. Its device defaults to "cuda": where CUDA is absent (a MUSA card) such a
# scaler disables itself with a warning, and FP16 trains without loss scaling.
SCALERS = frozenset({"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})


def scaler_without_device(rule: Rule, node: cst.Call) -> bool:
    """``torch.amp.GradScaler(...)`` given no device: no positional argument, no ``device=``, no ``*``/``**``."""
    if not rule.ctx.maybe(node.func, "GradScaler") or not rule.ctx.qnames(node.func) & SCALERS:
        return False
    return not any(a.keyword is None or a.star or a.keyword.value == "device" for a in node.args)


def new_callee(ref: AmpRef, func: cst.BaseExpression) -> cst.BaseExpression:
    """``torch.cuda.amp.X`` -> ``torch.amp.X``; an imported name stays (its import moves instead)."""
    if ref.style != "rooted":
        return func
    # func is Attribute(Attribute(Attribute(torch, cuda), amp), X): drop the vendor segment.
    amp = func.value
    return func.with_changes(value=amp.with_changes(value=amp.value.value))


def amp_refs_for(rule: Rule, *apis: str) -> list[AmpRef]:
    """The rewritable references to the given APIs."""
    return [r for r in refs_of(rule.ctx).refs if r.api in apis and r.rewrite]


def report_fallback(rule: Rule, ref: AmpRef, choice: DeviceChoice, new: str, example: str) -> None:
    """The device was hard-coded to the old vendor: say so and show the device-agnostic form.

    ``new`` is the rewrite; ``example`` the same call (the user's own arguments) taking a
    ``device_type`` variable instead. After ``--fix`` the reminder stays, as ``hard-coded-device``.
    """
    if not choice.fallback:
        return
    old = f"torch.{ref.vendor}.amp.{ref.api}"
    rule.report(
        ref.node, "deprecated-amp-api",
        f"{old} is deprecated; rewritten to `{new}` with the device hard-coded to {choice.code} "
        f"({choice.why}). Pass the device in so the code runs on cuda, musa and cpu.",
        f"{example}  # device_type: \"cuda\", \"musa\" or \"cpu\", passed in", rewritten=True,
    )
