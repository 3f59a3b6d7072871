import pytest
import torch

from ampkit.device import Device, detect_device
from ampkit.device.hardware import capabilities, card_facts, probe_dtype


def test_cpu_probe_decides():
    caps = capabilities(Device("cpu"))
    assert caps.dtypes["fp32"].supported
    for k in ("bf16", "fp16"):
        s = caps.dtypes[k]
        # The CPU has no table answer: the probe decides, and it ran.
        assert s.provenance == "probe" and s.probe is not None


def test_probe_checks_against_fp32():
    r = probe_dtype(Device("cpu"), torch.bfloat16)
    assert r.ok and r.max_rel_error is not None and r.max_rel_error < 0.05


def test_no_probe_is_unverified_on_cpu():
    caps = capabilities(Device("cpu"), probe=False)
    assert caps.dtypes["bf16"].provenance == "unverified" and caps.dtypes["bf16"].supported is None


@pytest.mark.parametrize(
    "card,bf16,fp16,fp16_prov",
    [
        ("MTT S80", False, True, "table"),
        ("MTT S3000", False, True, "table"),
        ("MTT S4000", True, True, "table"),
        ("MTT S5000", True, True, "probe"),  # FP16 unverified by the table: the probe decides
        ("MTT S7000", True, True, "probe"),  # unknown card, capability 3.2: treated like PH1
    ],
)
def test_musa_cards(simulated_musa, card, bf16, fp16, fp16_prov):
    simulated_musa(card)
    caps = capabilities(detect_device())
    assert caps.dtypes["bf16"].supported is bf16
    assert caps.dtypes["bf16"].provenance == "table"
    assert caps.dtypes["fp16"].supported is fp16
    assert caps.dtypes["fp16"].provenance == fp16_prov


def test_s80_bf16_trap_probe_error_keeps_table(simulated_musa):
    simulated_musa("MTT S80")
    caps = capabilities(detect_device())
    s = caps.dtypes["bf16"]
    assert s.supported is False and s.provenance == "table"
    assert s.probe.startswith("error")
    assert caps.collectives.supported is False  # no MCCL on QY1


def test_s5000_fp16_unverified_without_probe(simulated_musa):
    simulated_musa("MTT S5000")
    caps = capabilities(detect_device(), probe=False)
    assert caps.dtypes["fp16"].provenance == "unverified"
    assert caps.fp8.supported is True


def test_unknown_card_by_capability(simulated_musa):
    simulated_musa("MTT S7000")
    facts = card_facts(detect_device())
    assert "unknown card" in facts.family and facts.bf16 is True


@pytest.mark.parametrize("cap,bf16,tf32,fp8", [((7, 0), False, False, False), ((8, 0), True, True, False),
                                               ((9, 0), True, True, True)])
def test_nvidia_by_capability(simulated_cuda, cap, bf16, tf32, fp8):
    simulated_cuda(cap)
    dev = detect_device()
    assert dev.type == "cuda"
    caps = capabilities(dev)
    assert caps.dtypes["bf16"].supported is bf16
    assert caps.dtypes["fp16"].supported is True
    assert caps.tf32.supported is tf32
    assert caps.fp8.supported is fp8


def test_v100_trap_noted(simulated_cuda):
    simulated_cuda((7, 0))
    caps = capabilities(detect_device())
    assert any("emulation" in n for n in caps.notes)
