"""The device layer: which device, what its card supports, and the one precision decision.

The only package in ampkit that names a vendor ("musa", "cuda"): everything else asks it.

* :mod:`.layer`: :class:`Device`: torch module, card name, memory, seeding, grad scaler, TF32 switches,
  collective backend, debugging variables; :mod:`.detect`: :func:`detect_device`, :func:`parse_device`;
  :mod:`.timer`: elapsed device time
* :mod:`.hardware`: the card table and the run-time probe, with provenance (:func:`capabilities`)
* :mod:`.policy`: :func:`resolve_precision`, the one place precision is decided, with its reason
* :mod:`.provenance`: where a recorded figure came from (git commit, versions)
* :mod:`.doctor`: what ``ampkit doctor`` reports

It imports nothing else of ampkit but :mod:`ampkit.errors`, :mod:`ampkit.choices` and
:mod:`ampkit.compat`. Importing this package loads only the device itself (:mod:`.layer`,
:mod:`.detect`); the card table and the policy load when asked for.

>>> dev = ampkit.detect_device("cpu")
>>> dev.type
'cpu'
"""

from ampkit.device.detect import detect_device, parse_device
from ampkit.device.layer import DEVICE_TYPES, ENV_VAR, Device

__all__ = ["Device", "detect_device", "parse_device", "DEVICE_TYPES", "ENV_VAR"]
