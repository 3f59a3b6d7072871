"""How a diagnose run stops the script it runs (its own module: every check raises it, the runner catches it)."""

from __future__ import annotations

__all__ = ["StopRun"]


class StopRun(BaseException):
    """Raised inside the script to stop it (step budget reached, or a finding that ends the run).

    A BaseException so that the script's ``except Exception`` blocks do not swallow it.
    """
