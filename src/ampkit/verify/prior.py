"""``compare --continue``: the seeds an earlier comparison in the same folder already ran.

An INCONCLUSIVE verdict says how many seeds would decide it. On a large model each seed is minutes of
training, so the runs already made are kept: ``compare.json`` records, beside the verdict, the settings that
make two comparisons the same (:func:`settings`) and what the verdict reads from each run (:func:`run_record`).
A later ``compare --continue --seeds N`` with the same settings loads those runs (:func:`load_prior`), trains
only the seeds that are missing, and judges all of them together. Any difference in the settings (task and
its options, precision, FP8 recipe and layers, steps, logging, learning rate, FP32 regions, device, torch) is
refused in one line that names it, so runs that are not pairs of one experiment are never mixed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError
from ampkit.training.trainer import TrainResult
from ampkit.verify.runs import Run

__all__ = ["settings", "run_record", "load_prior", "refuse_existing", "default_out", "SCHEMA"]

SCHEMA = 1  # the layout of ``continuation`` in compare.json


def refuse_existing(out: str | Path | None, *, resume: bool, script: bool = False) -> None:
    """``--out`` on a folder that already holds a comparison, without ``--continue``: one line, exit 2, nothing
    touched (a second comparison would replace its verdict, or mix its runs with the old ones). A folder with
    other files holds no comparison."""
    found = [] if out is None or resume else _held(Path(out))
    if found:
        how = "" if script else "add seeds to it with --continue (same settings, more --seeds), or "
        raise UsageError(f"--out {out} already holds a comparison ({', '.join(found)}): {how}give a fresh --out "
                         "folder (nothing was changed)")


def _held(folder: Path) -> list[str]:
    """What of a comparison ``folder`` holds: ``compare.json``, and a SCRIPT comparison's non-empty ``runs/``."""
    runs = folder / "runs"
    return [name for name, there in (("compare.json", (folder / "compare.json").exists()),
                                     ("runs/", runs.is_dir() and any(runs.iterdir()))) if there]


def default_out(*, resume: bool, base: str | Path = "runs/compare") -> Path:
    """The folder of a comparison when ``--out`` is not given: ``runs/compare``, or the first of
    ``runs/compare-2``, ``-3``, ... that holds none, so a second comparison never replaces the first;
    with ``--continue``, the newest that holds one."""
    base = Path(base)
    numbered = []  # runs/compare-2, -3, ... as long as each holds a comparison
    while _held(base.with_name(f"{base.name}-{len(numbered) + 2}")):
        numbered.append(base.with_name(f"{base.name}-{len(numbered) + 2}"))
    held = ([base] if _held(base) else []) + numbered
    if resume:
        return held[-1] if held else base
    return base.with_name(f"{base.name}-{len(numbered) + 2}") if held and held[0] == base else base


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists, keys strings), so a fresh key equals a loaded one."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def settings(*, task_spec: Any, task: Any, task_options: dict[str, Any] | None, amp: Any, steps: int,
             log_every: int, lr: float | None, fp32_modules: tuple[str, ...], graph: bool | None,
             fp8_recipe: str, fp8_layers: str, torch_version: str) -> dict[str, Any]:
    """What must be equal for the runs of two comparisons to be judged together."""
    fp8 = amp.name == "fp8"
    return _plain({
        "task": task_spec if isinstance(task_spec, str) else task.name, "task_description": task.description,
        "task_options": task_options or {}, "precision": amp.name, "dtype": str(amp.dtype),
        "scaler": bool(amp.use_scaler), "fp8_recipe": fp8_recipe if fp8 else None,
        "fp8_layers": fp8_layers if fp8 else None, "steps": steps, "log_every": log_every,
        "lr": lr if lr is not None else task.lr, "fp32_modules": list(fp32_modules),
        "graph": graph is not False, "device": amp.device.name, "torch": torch_version,
    })


def run_record(run: Run) -> dict[str, Any]:
    """What the verdict and the speed figures read from one run (a JSON object)."""
    r = run.result
    return _plain({"precision": run.precision, "metric": run.metric, "final": _finite(run.final),
                   "wall_s": run.wall_s, "steps": r.steps, "skipped": r.skipped, "final_loss": _finite(r.final_loss),
                   "history": [{k: _finite(v) for k, v in h.items()} for h in r.history],
                   "samples_per_s": r.samples_per_s, "peak_mem_bytes": r.peak_mem_bytes, "warnings": r.warnings,
                   "step_graph": r.step_graph, "step_graph_fallback": r.step_graph_fallback})


def _finite(value: Any) -> Any:
    # compare.json is strict JSON (no NaN): a non-finite number is kept as its name and read back below.
    if isinstance(value, float) and not math.isfinite(value):
        return {"nonfinite": str(value)}
    return value


def _number(value: Any) -> Any:
    return float(value["nonfinite"]) if isinstance(value, dict) and set(value) == {"nonfinite"} else value


def _run(seed: int, rec: dict[str, Any], task: str) -> Run:
    history = [{k: _number(v) for k, v in h.items()} for h in rec["history"]]
    final = _number(rec["final"])
    result = TrainResult(task=task, precision=rec["precision"], precision_reason="loaded from compare.json",
                         device="", steps=rec["steps"], start_step=0, skipped=rec["skipped"],
                         final_loss=_number(rec["final_loss"]), metrics={rec["metric"]: final}, history=history,
                         samples_per_s=rec["samples_per_s"], peak_mem_bytes=rec["peak_mem_bytes"],
                         wall_s=rec["wall_s"], out=None, warnings=list(rec["warnings"]),
                         step_graph=rec["step_graph"], step_graph_fallback=rec["step_graph_fallback"])
    return Run(seed=seed, precision=rec["precision"], result=result, metric=rec["metric"], final=final,
               wall_s=rec["wall_s"], fp32_modules=())


def load_prior(out: str | Path, key: dict[str, Any]) -> dict[str, dict[int, Run]]:
    """The runs of the comparison in ``out`` (by side and seed), after checking that it was run
    with the same ``key``; a one-line :class:`UsageError` when there is none or it differs."""
    path = Path(out) / "compare.json"
    if not path.is_file():
        raise UsageError(f"--continue adds seeds to the comparison in --out, but {path} does not exist: run without "
                         f"--continue first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cont = data["continuation"]
        if cont.get("schema") != SCHEMA:
            raise KeyError("schema")
        saved, records = cont["settings"], cont["runs"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"{path} holds no runs that can be continued (written by an older ampkit, by compare "
                         f"SCRIPT, or damaged): run into another --out") from None
    diff = [k for k in sorted(set(saved) | set(key)) if saved.get(k) != key.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {saved.get(k)!r} there, {key.get(k)!r} now" for k in diff[:3])
        raise UsageError(f"--continue: {path} was run with other settings ({shown}); give the same options, "
                         f"or another --out")
    try:
        runs = {side: {int(s): _run(int(s), rec, data.get("task", "")) for s, rec in records[side].items()}
                for side in ("fp32", "amp")}
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: its recorded runs are damaged: run into another --out") from None
    if set(runs["fp32"]) != set(runs["amp"]):
        raise UsageError(f"{path}: its FP32 and AMP runs are not of the same seeds: run into another --out")
    return runs
