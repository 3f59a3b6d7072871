"""The record a diagnose run returns, and the diagnose view of the one registry (:mod:`ampkit.findings`).

A :class:`Finding` is plain data (``code, message, where, fix, step``) so it serialises to the
JSON list ``ampkit diagnose --json`` writes. ``FIXES`` holds the generic fix per code (read from the
registry); a finding may carry a more specific one (naming the module or the line to change).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ampkit.findings import codes, info

__all__ = ["Finding", "FIXES", "CODES", "TITLES", "fix_for"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One defect found at run time.

    ``where`` names the module path and/or ``file:line`` of the user's code; ``step`` is the number
    of optimizer steps completed when it was seen (0 = before the first step), None when it is
    not tied to a step.
    """

    code: str
    message: str
    where: str
    fix: str
    step: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# Every registry code (diagnose reports those whose ``commands`` include "diagnose"; the rest come
# from `ampkit migrate` and share the spelling).
CODES: tuple[str, ...] = codes()
TITLES: dict[str, str] = {code: info(code).title for code in CODES}
FIXES: dict[str, str] = {code: info(code).fix for code in CODES}


def fix_for(code: str) -> str:
    """The generic fix for ``code`` from the registry (KeyError for an unknown code)."""
    return info(code).fix
