"""``ampkit diagnose``: run an unmodified training script under instrumentation and name its AMP defects.

>>> from ampkit.diagnose import diagnose_script
>>> result = diagnose_script("train.py", ["--lr", "1e-3"], steps=20)   # doctest: +SKIP
>>> for f in result.findings:                                          # doctest: +SKIP
...     print(f.code, f.where, f.fix)

``fp16_range_report(model, batches, loss_fn)`` predicts, from an FP32 run, which modules would overflow
or underflow FP16 (for FP16-only cards such as the MTT S80/S3000), the initial loss scale to use and the
modules to keep in FP32; ``fp16_range_script`` does the same for a script.
"""

from __future__ import annotations

from ampkit.diagnose.findings import CODES, FIXES, Finding
from ampkit.diagnose.fp16range import ModuleRange, RangeReport, fp16_range_report
from ampkit.diagnose.runner import DiagnoseResult, diagnose_script, fp16_range_script

__all__ = [
    "CODES",
    "FIXES",
    "Finding",
    "DiagnoseResult",
    "diagnose_script",
    "fp16_range_script",
    "fp16_range_report",
    "RangeReport",
    "ModuleRange",
]
