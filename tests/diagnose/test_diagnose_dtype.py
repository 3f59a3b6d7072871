"""dtype-unsupported on a simulated MUSA card (the simulated torch.musa of tests/musa_sim.py).

The simulated device cannot run kernels, so diagnose must decide at autocast construction, from
the card table, and stop the script there.
"""

from __future__ import annotations

import os

from ampkit.diagnose import diagnose_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_bf16_autocast_on_s80_is_found(simulated_musa):
    simulated_musa("MTT S80")
    result = diagnose_script(os.path.join(SCRIPTS, "bf16_on_s80.py"))
    assert result.codes() == ["dtype-unsupported"]
    f = result.findings[0]
    assert "MTT S80" in f.message and "BF16" in f.message
    assert "bf16_on_s80.py:7" in f.where
    assert "torch.float16" in f.fix and "GradScaler" in f.fix
    assert result.stopped.startswith("autocast to BF16 is not supported")


def test_fp16_twin_on_s80_has_no_dtype_finding(simulated_musa):
    simulated_musa("MTT S80")
    result = diagnose_script(os.path.join(SCRIPTS, "bf16_on_s80_clean.py"))
    assert "dtype-unsupported" not in result.codes()
    # The simulation registers no "musa" backend in torch's dispatcher, so torch itself then refuses
    # the device string: the simulation's limit, not a finding about the script.
    assert all(f.code == "script-error" and "musa" in f.message for f in result.findings)


def test_bf16_on_s4000_is_fine(simulated_musa):
    simulated_musa("MTT S4000")
    result = diagnose_script(os.path.join(SCRIPTS, "bf16_on_s80.py"))
    assert "dtype-unsupported" not in result.codes()


def test_bf16_on_old_nvidia_card_is_found(simulated_cuda, tmp_path):
    simulated_cuda((7, 0))
    p = tmp_path / "v100.py"
    p.write_text("import torch\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n    pass\n")
    result = diagnose_script(str(p))
    assert result.codes() == ["dtype-unsupported"]
    assert "V100" in result.findings[0].message and "v100.py:2" in result.findings[0].where
