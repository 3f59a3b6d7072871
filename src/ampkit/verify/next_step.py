"""The command to run after a comparison that did not pass, for the terminal summary and the report alike.

``--explain`` reruns a task with changed settings, so ``compare SCRIPT`` refuses it (the script decides its model,
device and learning rate); a script's comparison points to ``ampkit diagnose``, which runs the same script
unmodified and names the defect and its fix (issue 45: the advice must be a command that runs).
"""

from __future__ import annotations

import shlex

from ampkit.verify.result import CompareResult

__all__ = ["after_failure"]


def after_failure(r: CompareResult) -> tuple[str, str]:
    """(the command, what it does) after a FAIL or INCONCLUSIVE without an explain recommendation."""
    source = r.source or {}
    if source.get("kind") == "script":
        cmd = " ".join(shlex.quote(str(x)) for x in ["ampkit", "diagnose", source["script"], *source.get("args", [])])
        return cmd, "runs your script under instrumentation and names the defect and its fix"
    return (f"ampkit compare --task {r.task} --precision {r.precision} --explain",
            "names the module that adds the error and tries fixes")
