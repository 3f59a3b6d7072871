"""``ampkit migrate``: rewrite deprecated and vendor-specific AMP code, and lint AMP misuse.

Built on libcst, so formatting and comments survive. One rule per module under ``rules/``.

>>> from ampkit.migrate import migrate_source
>>> migrate_source("import torch\\nctx = torch.cuda.amp.autocast()\\n").new_code
'import torch\\nctx = torch.amp.autocast("cuda")\\n'
"""

from __future__ import annotations

from ampkit.migrate.context import TARGETS
from ampkit.migrate.engine import MigrateResult, SourceSyntaxError, migrate_source
from ampkit.migrate.files import FileResult, atomic_write, migrate_paths
from ampkit.migrate.findings import CODES, Finding

__all__ = [
    "CODES",
    "TARGETS",
    "Finding",
    "FileResult",
    "MigrateResult",
    "SourceSyntaxError",
    "atomic_write",
    "migrate_paths",
    "migrate_source",
]
