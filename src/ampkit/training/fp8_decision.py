"""The measured FP8 decision for ``ampkit train`` (and ``ampkit compare``, which trains through it).

:func:`trial_setup` says how the trial of :func:`ampkit.engine.fp8_choice.measured_decision` times this run:
copies of the task's model trained on the task's own first batches with the run's optimizer, eager steps (train
runs its steps eagerly or as a step graph, never through ``torch.compile``). The trial runs on accelerators only:
FP8 GEMMs exist there, and a CPU's timings say nothing about them; elsewhere the decision falls back to the cost
model and the layers' shapes, and says so.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from ampkit.device import Device
from ampkit.device.policy import Precision
from ampkit.engine.fp8_choice import TrialSetup
from ampkit.tasks import Task, map_tensors

__all__ = ["trial_setup", "TRIAL_BATCHES"]

TRIAL_BATCHES = 4  # the task's first batches, cycled through the trial's steps


def trial_setup(*, task: Task, model: nn.Module, precision: Precision, device: Device, recipe: str,
                make_optimizer: Callable[[nn.Module], Any], max_grad_norm: float | None,
                progress: Callable[[dict[str, Any]], None] | None) -> TrialSetup | None:
    """The trial's timing for this run, or None where no trial runs (not an accelerator)."""
    if not device.is_accelerator:
        return None
    from ampkit.engine.fp8_trial_steps import StepTrial

    dev = device.torch_device
    batches = [map_tensors(task.batch(i), lambda t: t.to(dev, non_blocking=True)) for i in range(TRIAL_BATCHES)]
    trial = StepTrial(model=model, loss=task.loss, batches=batches, make_optimizer=make_optimizer,
                      precision=precision, device=device, recipe=recipe, compile_kwargs=None,
                      max_grad_norm=max_grad_norm)
    return TrialSetup(measure=trial, batch=batches[0], card=device.name, capability=device.capability,
                      progress=progress, release=trial.release, key_extra={"steps": "train eager"})
