"""The engine: :class:`MixedPrecision` and everything its step composes.

* :mod:`.core`: :class:`MixedPrecision` (autocast, scaling, unscale, clip, on-device skip, scaler
  update, accumulation, ``train_step``); :mod:`.state`: its ``state_dict`` / ``load_state_dict``
* :mod:`.step`: the pure step functions (optimizer checks, clipping); :mod:`.windows`: accumulation
  windows; :mod:`.counters`: the on-device counters; :mod:`.schedule`: LR schedules that skip with the step
* :mod:`.regions`: FP32 regions (``fp32_modules``); :mod:`.fp8`: torchao float8 conversion
* :mod:`.graph`: the whole-step device graph; :mod:`.config`: the frozen :class:`AmpConfig` and its
  presets; :mod:`.monitor`: the ``scale-collapse`` warning

It imports the device layer (:mod:`ampkit.device`) and nothing above it (training, verify, cli).
"""

from ampkit.engine.config import AmpConfig
from ampkit.engine.core import MixedPrecision
from ampkit.engine.step import is_fused

__all__ = ["MixedPrecision", "AmpConfig", "is_fused"]
