"""``ampkit train``: :func:`train` runs a :class:`TrainConfig`; the parts, one concern per module:

* :mod:`.config`: :class:`TrainConfig`, what a run depends on, validated before any process starts
* :mod:`.trainer`: :func:`train` and :class:`TrainResult`: setup, resume, the loop, evaluation
* :mod:`.setup`: builds the run (process group, precision, task, model, optimizer, scheduler, engine,
  checkpoints, callbacks) from a :class:`TrainConfig`
* :mod:`.resume`: the newest complete checkpoint, of either kind, into the live objects
* :mod:`.loop`: micro-batches, the engine's step, callbacks, log and checkpoint cadence, the stop
* :mod:`.metrics`: the loss window, metrics records and their sinks (JSONL, TensorBoard, scale monitor)
* :mod:`.stop`: signals, and the stop every rank agrees on
* :mod:`.callbacks`: user code before and after each step
"""

from ampkit.training.callbacks import Callback, TrainState
from ampkit.training.config import TrainConfig
from ampkit.training.trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train", "Callback", "TrainState"]
