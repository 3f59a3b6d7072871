"""What a migrate rule reports: :class:`Finding`, and the codes migrate can report with their titles.

The codes, titles and generic fixes live in the one registry, :mod:`ampkit.findings`; ``CODES`` is
migrate's view of it (code -> title, in registry order).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.findings import MIGRATE, codes, info

__all__ = ["Finding", "CODES"]

# Stable codes (shared with `ampkit diagnose`). Scripts and `--select` depend on the spelling.
CODES: dict[str, str] = {code: info(code).title for code in codes(MIGRATE)}


@dataclass(frozen=True)
class Finding:
    """One problem found in a file.

    ``fix`` is the code to write instead; ``rewritten`` says whether ``--fix`` applies it for you.
    """

    code: str
    message: str
    path: str
    line: int
    fix: str
    rewritten: bool = False

    def where(self) -> str:
        """``path:line``, the form editors and terminals link."""
        return f"{self.path}:{self.line}"
