"""A simulated ``torch.musa`` built from ../shared/MUSA.md. No MUSA card is reachable from our
machines, so every MUSA path in ampkit is tested against this namespace, and only this one.

What it reproduces:
* the runtime API that torch_musa mirrors from torch.cuda (names, capability, properties, memory,
  RNG, synchronize, ``amp.GradScaler``), and ``torch.version.musa``;
* ``torch.backends.mudnn.allow_tf32`` and, for v2.9+, ``torch.backends.musa.matmul.allow_tf32``;
* the emulation trap: ``is_bf16_supported()`` says True on an S80 (default ``including_emulation=True``)
  while ``is_bf16_supported(including_emulation=False)`` says False;
* kernels: since tensors cannot live on a device that does not exist, the run-time probe is
  replaced by one that does the same arithmetic on the CPU and raises what torch_musa raises
  for a dtype the card cannot run (BF16 on QY1).

The same file simulates NVIDIA cards of a given compute capability on a CPU-only torch.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

# name -> (capability, bf16 kernels run?, fp16 kernels run?)
CARDS = {
    "MTT S80": ((2, 1), False, True),
    "MTT S3000": ((2, 1), False, True),
    "MTT S4000": ((2, 2), True, True),
    "MTT S5000": ((3, 1), True, True),
    "MTT S7000": ((3, 2), True, True),  # an unknown future card: decided by capability
}


@dataclass
class _Props:
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int = 128
    is_multi_gpu_board: bool = False
    is_integrated: bool = False


def make_musa_module(name: str, *, version: str = "2.7.1", count: int = 1):
    cap, bf16_ok, _ = CARDS[name]
    rng = {"state": torch.zeros(16, dtype=torch.uint8)}
    m = types.ModuleType("torch_musa")
    m.__version__ = version
    m.is_available = lambda: True
    m.device_count = lambda: count
    m.current_device = lambda: 0
    m.set_device = lambda i: None
    m.synchronize = lambda i=None: None
    m.get_device_name = lambda i=0: name
    m.get_device_capability = lambda i=0: cap
    m.get_device_properties = lambda i=0: _Props(name, cap[0], cap[1], 48 * 2**30)
    m.get_arch_list = lambda: [f"mp_{cap[0]}{cap[1]}"]

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        # torch_musa issue #122: a bf16 tensor can be created on QY1, so the default says True.
        return True if including_emulation else bf16_ok

    m.is_bf16_supported = is_bf16_supported
    m.is_tf32_supported = lambda: cap >= (2, 2)
    peak = {"v": 0}
    m.memory_allocated = lambda i=0: 0
    m.max_memory_allocated = lambda i=0: peak["v"]
    m.reset_peak_memory_stats = lambda i=0: peak.update(v=0)
    m.empty_cache = lambda: None
    m.mem_get_info = lambda i=0: (40 * 2**30, 48 * 2**30)
    m.manual_seed = lambda s: None
    m.manual_seed_all = lambda s: None
    m.get_rng_state = lambda i=0: rng["state"].clone()
    m.set_rng_state = lambda s, i=0: rng.update(state=s.clone())
    amp = types.ModuleType("torch_musa.amp")

    class GradScaler(torch.amp.GradScaler):
        """torch.musa.amp.GradScaler: a subclass of torch.amp.GradScaler(device="musa")."""

        def __init__(self, **kwargs):
            super().__init__("musa", **kwargs)

    amp.GradScaler = GradScaler
    amp.autocast = lambda **kw: torch.autocast(device_type="musa", **kw)
    m.amp = amp
    return m


def simulated_probe_factory(bf16_ok: bool, fp16_ok: bool, vendor_error: str):
    from ampkit.device import hardware
    from ampkit.device import Device

    real = hardware.probe_dtype

    def probe(device, dtype, **kw):
        ok = {torch.bfloat16: bf16_ok, torch.float16: fp16_ok}.get(dtype, True)
        if not ok:
            return hardware.ProbeResult(False, f"error: RuntimeError: {vendor_error}", errored=True)
        # Same arithmetic, on the CPU: the simulated card computes like a correct one.
        return real(Device("cpu"), dtype, **kw)

    return probe


def install_musa(monkeypatch, name: str, *, version: str = "2.7.1", v29_matmul: bool = False,
                 bf16_probe_passes: bool = False, tf32_on: bool = False):
    """Register a simulated torch.musa for card ``name`` (see CARDS).

    ``bf16_probe_passes``: the run-time BF16 probe succeeds even where the card has no BF16 (the emulation
    trap at its worst: a small op happens to run). ``tf32_on``: the TF32 switches start True (torch_musa
    v2.7's default for mudnn)."""
    from ampkit.device import hardware

    module = make_musa_module(name, version=version)
    monkeypatch.setattr(torch, "musa", module, raising=False)
    monkeypatch.setattr(torch.version, "musa", "4.0.0", raising=False)
    mudnn = types.SimpleNamespace(allow_tf32=tf32_on)
    monkeypatch.setattr(torch.backends, "mudnn", mudnn, raising=False)
    if v29_matmul:
        monkeypatch.setattr(torch.backends, "musa",
                            types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=tf32_on)), raising=False)
    _, bf16_ok, fp16_ok = CARDS[name]
    monkeypatch.setattr(hardware, "probe_dtype",
                        simulated_probe_factory(bf16_ok or bf16_probe_passes, fp16_ok,
                                                "MUSA error: invalid device function (bf16 on mp_21)"))
    return module


def install_cuda(monkeypatch, capability: tuple[int, int], name: str | None = None):
    """Pretend the CPU-only torch sees one NVIDIA card of ``capability``."""
    from ampkit.device import hardware

    name = name or {(7, 0): "Tesla V100-SXM2-32GB", (8, 0): "NVIDIA A100-SXM4-80GB",
                    (9, 0): "NVIDIA H100 80GB HBM3"}.get(capability, f"NVIDIA sm_{capability[0]}{capability[1]}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=0: _Props(name, capability[0], capability[1], 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: True if including_emulation else capability >= (8, 0))
    bf16_ok = capability >= (8, 0)
    monkeypatch.setattr(hardware, "probe_dtype",
                        simulated_probe_factory(bf16_ok, True, "CUDA error: no kernel image is available"))
