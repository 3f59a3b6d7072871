"""DDP and FSDP2 on PyTorch's own distributed engine, launched by ``torchrun``.

ampkit writes no collective and no process manager: ``torchrun`` starts one process per device (and
restarts them with ``--max-restarts``), :mod:`.group` reads its environment and joins the process
group with the backend the device layer names (nccl, mccl, gloo), :mod:`.wrap` wraps the model and
shares the data, :mod:`.launch` builds and runs the torchrun command of ``ampkit train --nproc``.
Sharded checkpoints live in :mod:`ampkit.checkpoint.dcp`.

>>> ctx = init_from_env()                      # None when not started by torchrun  # doctest: +SKIP
>>> model = wrap_model(model, "fsdp", precision, ctx.device)                        # doctest: +SKIP
>>> amp = MixedPrecision(precision, agree=ctx.agree)   # every rank takes the same skip decision  # doctest: +SKIP

Data: the task's ``batch(step)`` is the *global* batch; rank ``r`` of ``w`` trains on rows
``r::w`` of it (:func:`shard_batch`), so the gradient averaged over ranks, and the loss averaged
over ranks for the log, equal a single process's on the whole batch.
"""

from ampkit.distributed.group import (DistContext, active, agree_found_inf, check_collectives, init_from_env,
                                      launched)
from ampkit.distributed.launch import run_torchrun, torchrun_argv
from ampkit.distributed.wrap import STRATEGIES, mp_policy, shard_batch, unwrap, wrap_model

__all__ = ["STRATEGIES", "DistContext", "launched", "active", "init_from_env", "check_collectives", "wrap_model",
           "unwrap", "mp_policy", "agree_found_inf", "shard_batch", "torchrun_argv", "run_torchrun"]
