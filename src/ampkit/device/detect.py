"""Which device to run on: ``--device``, then ``$AMPKIT_DEVICE``, then the first available."""

from __future__ import annotations

import os

from ampkit.device.layer import DEVICE_TYPES, ENV_VAR, Device, _available, _module_for
from ampkit.errors import DeviceError

__all__ = ["parse_device", "detect_device"]


def parse_device(spec: str) -> Device:
    """Parse ``"cuda"``, ``"cuda:1"``, ``"musa"``, ``"cpu"`` ... into a :class:`Device` (no availability check)."""
    text = spec.strip().lower()
    dev_type, _, idx = text.partition(":")
    if dev_type not in DEVICE_TYPES:
        raise DeviceError(f"unknown device {spec!r}: use one of {', '.join(DEVICE_TYPES)} (optionally with :INDEX)")
    if idx:
        if not idx.isdigit():
            raise DeviceError(f"bad device index in {spec!r}: use e.g. {dev_type}:0")
        index: int | None = int(idx)
    else:
        index = None if dev_type == "cpu" else 0
    if dev_type == "cpu":
        index = None
    return Device(dev_type, index)


def detect_device(spec: str | None = None) -> Device:
    """The device to run on.

    ``spec`` (e.g. from ``--device``) wins, then ``$AMPKIT_DEVICE``, then the first available of
    musa, cuda, xpu, mps, cpu. An explicit device that is not available is an error, not a
    silent fall back to the CPU.

    >>> ampkit.detect_device("cpu")
    Device(type='cpu', index=None)
    >>> ampkit.detect_device("cuda:7")        # doctest: +SKIP
    Traceback (most recent call last):
    ampkit.errors.DeviceError: ...
    """
    spec = spec or os.environ.get(ENV_VAR) or None
    if spec:
        dev = parse_device(spec)
        if not _available(dev.type):
            source = "--device" if spec != os.environ.get(ENV_VAR) else f"${ENV_VAR}"
            raise DeviceError(f"device {spec!r} ({source}) is not available on this machine: "
                              f"run `ampkit doctor` to see what is, or pass --device cpu")
        if dev.index is not None and dev.type in ("musa", "cuda", "xpu"):
            count = dev.module.device_count()
            if dev.index >= count:
                raise DeviceError(f"device {spec!r} does not exist: this machine has {count} {dev.type} device(s)")
        return dev
    for dev_type in DEVICE_TYPES:
        if _available(dev_type):
            if dev_type in ("musa", "cuda", "xpu"):
                return Device(dev_type, int(_module_for(dev_type).current_device()))
            return Device(dev_type, None if dev_type == "cpu" else 0)
    return Device("cpu")
