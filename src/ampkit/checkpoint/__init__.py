"""Checkpoints: atomic single-file save and ``weights_only`` load, what goes into a file, and DCP.

* :mod:`.file`: :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`restore`, the
  :class:`CheckpointManager` (rotation), RNG state, atomic writes
* :mod:`.content`: what a file holds (wrapped-model names, the save-time check that it will load)
* :mod:`.dcp`: sharded checkpoints of FSDP2 runs (``torch.distributed.checkpoint``)

It imports the device layer and the engine's state, nothing above them.
"""

from ampkit.checkpoint.file import (CheckpointManager, Found, Restored, atomic_write_bytes, check_loadable,
                                    fsync_dir, load_checkpoint, load_parts, prepare_folder, restore,
                                    restore_engine, rng_state, save_checkpoint, set_rng_state, unwrap_model)

__all__ = ["save_checkpoint", "load_checkpoint", "restore", "Restored", "CheckpointManager", "Found", "rng_state",
           "set_rng_state", "atomic_write_bytes", "fsync_dir", "prepare_folder", "restore_engine", "load_parts",
           "unwrap_model", "check_loadable"]
