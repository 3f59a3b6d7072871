"""Module paths that moved in ampkit 0.2 (the layout of packages), kept importable for one release.

``import ampkit.policy`` (or ``from ampkit.trainer import train``) still works and gives the module at its
new place, with a :class:`DeprecationWarning` that names it; the public names of ``ampkit.*`` never moved.
The table is in ``docs/changelog.md`` too. Removed in ampkit 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED = {
    "ampkit.step": "ampkit.engine.step",
    "ampkit.graph": "ampkit.engine.graph",
    "ampkit.schedule": "ampkit.engine.schedule",
    "ampkit.counters": "ampkit.engine.counters",
    "ampkit.windows": "ampkit.engine.windows",
    "ampkit.regions": "ampkit.engine.regions",
    "ampkit.fp8": "ampkit.engine.fp8",
    "ampkit.config": "ampkit.engine.config",
    "ampkit.monitor": "ampkit.engine.monitor",
    "ampkit.hardware": "ampkit.device.hardware",
    "ampkit.policy": "ampkit.device.policy",
    "ampkit.provenance": "ampkit.device.provenance",
    "ampkit.doctor": "ampkit.device.doctor",
    "ampkit.checkpoint_content": "ampkit.checkpoint.content",
    "ampkit.checkpoint_dcp": "ampkit.checkpoint.dcp",
    "ampkit.trainer": "ampkit.training.trainer",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the old names with the modules at their new places (the same module objects)."""

    def find_spec(self, fullname: str, path, target=None):  # noqa: ANN001 - the finder protocol
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:  # noqa: ANN001
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new} in ampkit 0.2; the old path is removed in 0.3: "
                      f"import {new} (or the public name from ampkit)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at the new path is already executed


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (ampkit's ``__init__`` does it)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
