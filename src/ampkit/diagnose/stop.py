"""How a diagnose run stops the user's script: :class:`StopRun`.

Its own module because every wrapper module (casts, scaler checks, host reads) may raise it and the
instrumentation that installs them catches it: a module of its own keeps diagnose/ free of import
circles.
"""

from __future__ import annotations

__all__ = ["StopRun"]


class StopRun(BaseException):
    """Raised inside the script to stop it (step budget reached, or a finding that ends the run).

    A BaseException so that the script's ``except Exception`` blocks do not swallow it.
    """
