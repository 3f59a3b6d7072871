"""Proof that mixed precision worked: the FP32-vs-AMP verdict (:mod:`ampkit.verify.compare`), the
per-op dtype audit (:mod:`ampkit.verify.audit`) and the self-contained report (:mod:`ampkit.verify.report`).

The functions are exported as ``ampkit.compare`` and ``ampkit.audit``; nothing is imported here, so
``ampkit.verify.compare`` stays the module (not shadowed by the function of the same name).
"""

__all__ = ["compare", "audit", "report"]
