"""The rules, one per module, in the order their replacements compose."""

from __future__ import annotations

from ampkit.migrate.rules.autocast import AutocastRule
from ampkit.migrate.rules.base import Rule
from ampkit.migrate.rules.bce_under_autocast import BceUnderAutocastRule
from ampkit.migrate.rules.clip_before_unscale import ClipBeforeUnscaleRule
from ampkit.migrate.rules.custom_fwd import CustomFwdRule
from ampkit.migrate.rules.amp_imports import AmpImportsRule
from ampkit.migrate.rules.deprecated_api import DeprecatedApiRule
from ampkit.migrate.rules.device_target import DeviceTargetRule
from ampkit.migrate.rules.grad_scaler import GradScalerRule
from ampkit.migrate.rules.half_inside_autocast import HalfInsideAutocastRule
from ampkit.migrate.rules.hard_coded_device import HardCodedDeviceRule
from ampkit.migrate.rules.host_sync_per_step import HostSyncPerStepRule
from ampkit.migrate.rules.scaler_with_bf16 import ScalerWithBf16Rule
from ampkit.migrate.rules.unsafe_torch_load import UnsafeTorchLoadRule

__all__ = ["RULES", "Rule"]

RULES: tuple[type[Rule], ...] = (
    DeviceTargetRule,
    AutocastRule,
    GradScalerRule,
    CustomFwdRule,
    AmpImportsRule,
    DeprecatedApiRule,
    ClipBeforeUnscaleRule,
    ScalerWithBf16Rule,
    UnsafeTorchLoadRule,
    HostSyncPerStepRule,
    BceUnderAutocastRule,
    HalfInsideAutocastRule,
    HardCodedDeviceRule,
)
