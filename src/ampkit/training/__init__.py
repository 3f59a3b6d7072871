"""The trainer's parts, one concern per module (the entry point is :func:`ampkit.trainer.train`):

* :mod:`.setup`: builds the run (process group, precision, task, model, optimizer, scheduler, engine,
  checkpoints, callbacks) from a :class:`~ampkit.trainer.TrainConfig`
* :mod:`.resume`: the newest complete checkpoint, of either kind, into the live objects
* :mod:`.loop`: micro-batches, the engine's step, callbacks, log and checkpoint cadence, the stop
* :mod:`.metrics`: the loss window, metrics records and their sinks (JSONL, TensorBoard, scale monitor)
* :mod:`.stop`: signals, and the stop every rank agrees on
* :mod:`.callbacks`: user code before and after each step
"""

from ampkit.training.callbacks import Callback, TrainState

__all__ = ["Callback", "TrainState"]
