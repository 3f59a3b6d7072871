"""The processes ampkit starts (``compare SCRIPT`` runs, ``migrate``'s workers) die with ampkit.

See :mod:`ampkit.children.tied`: a new process group per child, stopped as a whole (SIGTERM, then SIGKILL)
when ampkit stops, and the kernel's parent-death signal for when ampkit is killed outright.
"""

from ampkit.children.tied import GRACE_S, init_worker, run_tied, start_tied, stop_group, tie_to_parent

__all__ = ["GRACE_S", "tie_to_parent", "init_worker", "start_tied", "stop_group", "run_tied"]
