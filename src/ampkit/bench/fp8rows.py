"""The models the fp8 rows of ``ampkit bench`` train: per recipe and mode, a copy converted as the FP8 plan says.

Eager and compiled FP8 differ a lot (torch.compile fuses the casts to FP8 into neighbouring kernels), so each
mode gets its own decision (:func:`ampkit.engine.fp8_choice.choose_fp8`): on an accelerator a trial that times
layer sets of this workload in that mode (:func:`trial_setup`), elsewhere the cost model; two plans that
convert the same layers share one copy. A mode where no layer pays gets its refusal line instead of a
model, and its rows say so (status ``refused``): bench never reports an FP8 row slower by construction
without saying why. ``--fp8-layers eligible`` converts every layer the shape filter allows.
"""

from __future__ import annotations

from typing import Any

from ampkit.bench.workloads import Workload, fp8_copy
from ampkit.device.policy import Precision
from ampkit.errors import PrecisionUnsupported

__all__ = ["fp8_workloads", "recipe_of"]


def recipe_of(label: str, recipes: tuple[str, ...]) -> str:
    """``"fp8"`` -> the one recipe asked for; ``"fp8-rowwise"`` -> ``"rowwise"``."""
    return recipes[0] if label == "fp8" else label[len("fp8-"):]


def trial_setup(config: Any, wl: Workload, prec: Precision, recipe: str, compiled: bool,
                progress: Any = None) -> Any:
    """How the measured FP8 decision times this workload (the bench's own model, batches, loss and optimizer, in
    the mode of the rows), or None off accelerators (there the cost model and the shapes decide)."""
    device = prec.device
    if not device.is_accelerator:
        return None
    from ampkit.engine.fp8_choice import TrialSetup
    from ampkit.engine.fp8_trial_steps import StepTrial

    kw: dict[str, Any] | None = None
    if compiled:
        kw = {"backend": config.compile_backend, **({"mode": config.compile_mode} if config.compile_mode else {})}
    fused = {"fused": True} if device.supports_fused_optimizer() else {}
    trial = StepTrial(model=wl.model, loss=wl.loss, batches=wl.batches, precision=prec, device=device, recipe=recipe,
                      make_optimizer=lambda m: wl.optimizer(m.parameters(), **fused), compile_kwargs=kw,
                      max_grad_norm=config.max_grad_norm)
    return TrialSetup(measure=trial, batch=wl.batches[0], card=device.name, capability=device.capability,
                      progress=progress, release=trial.release, key_extra={"steps": f"bench {kw or 'eager'}"})


def fp8_workloads(config: Any, wl: Workload, precisions: list[tuple[str, Precision]], modes: list[bool],
                  notes: list[str], progress: Any = None) -> tuple[dict[tuple[str, bool], Workload | str],
                                                                dict[str, Any]]:
    """``{("", False): wl, (fp8 label, compiled): copy or refusal line}`` and each plan's report by
    ``"<label> <mode>"`` (with the measured trial behind it, where one ran)."""
    from ampkit.engine.fp8_choice import choose_fp8

    workloads: dict[tuple[str, bool], Workload | str] = {("", False): wl}
    plans: dict[str, Any] = {}
    copies: dict[tuple[str, tuple[str, ...]], Workload] = {}
    tokens = wl.tokens_per_step or wl.samples_per_step
    for label, prec in precisions:
        if not label.startswith("fp8"):
            continue
        recipe = recipe_of(label, config.fp8_recipes)
        for compiled in modes:
            mode = "compiled" if compiled else "eager"
            trial = trial_setup(config, wl, prec, recipe, compiled, progress) if config.fp8_layers == "paying" else None
            try:
                choice = choose_fp8(wl.model, prec, auto=False, recipe=recipe, tokens=tokens, mode=mode,
                                    layers=config.fp8_layers, trial=trial)
            except PrecisionUnsupported as exc:
                workloads[(label, compiled)] = str(exc)
                tried = getattr(exc, "trial", None)
                plans[f"{label} {mode}"] = {"recipe": recipe, "refused": str(exc),
                                            **({"trial": tried.to_dict()} if tried is not None else {})}
                continue
            report = choice.report
            same = (recipe, report.converted)
            if same not in copies:
                copies[same], _ = fp8_copy(wl, recipe, chosen=report)
            workloads[(label, compiled)] = copies[same]
            plans[f"{label} {mode}"] = {**report.to_dict(),
                                        **({"trial": choice.trial.to_dict()} if choice.trial else {})}
            notes.append(f"{label} {mode} rows: {choice.note}; MFU against the BF16 matmul rate")
    return workloads, plans
