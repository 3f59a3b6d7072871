"""What a migrate rule reports: :class:`Finding`, and the codes migrate can report with their titles.

The codes, titles and generic fixes live in the one registry, :mod:`ampkit.findings`; ``CODES`` is
migrate's view of it (code -> title, in registry order).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.findings import MIGRATE, codes, info

__all__ = ["Finding", "CODES", "PORT_KINDS"]

# Stable codes (shared with `ampkit diagnose`). Scripts and `--select` depend on the spelling.
CODES: dict[str, str] = {code: info(code).title for code in codes(MIGRATE)}

#: what ``--target`` could not port, by kind (the order of the summary lines).
PORT_KINDS = {
    "device counting": "counts or picks devices through CUDA_VISIBLE_DEVICES or nvidia-smi",
    "vendor check": "tests for the CUDA vendor (torch.version.cuda, is_nccl_available, a .cuda(index))",
    "framework name": "a framework's accelerator name (Lightning's accelerator=\"cuda\"/\"gpu\")",
    "no twin": "a torch.cuda function or torch.backends.cuda switch torch.musa does not have",
    "device index": "a .cuda(x) whose argument may be an index or a device",
    "device test": "a test or search of a device's text that cannot be moved (re.match(r\"cuda:\\d+\", dev))",
    "backend": "a collective backend left as is because no device in the file moves",
}


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
    #: under ``--target musa|cuda``, what kind of thing could not be ported ("" for everything else):
    #: one of :data:`PORT_KINDS`; ``ampkit migrate`` prints one summary line per kind.
    kind: str = ""

    def where(self) -> str:
        """``path:line``, the form editors and terminals link."""
        return f"{self.path}:{self.line}"
