"""The loop checks on the ways scripts clear gradients: in place (`set_to_none=False`), through the model,
or not at all between scaler steps."""

from __future__ import annotations

import pytest

from ampkit.diagnose import diagnose_script

LOOP = (
    "import torch\nimport torch.nn as nn\n"
    "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "scaler = torch.amp.GradScaler('cpu')\n"
    "for i in range(5):\n"
    "    {clear}\n"
    "    with torch.autocast('cpu', dtype=torch.float16):\n"
    "        loss = model(torch.randn(8, 4)).float().pow(2).mean()\n"
    "    scaler.scale(loss).backward()\n"
    "    scaler.step(opt)\n"
    "    scaler.update()\n")


@pytest.mark.parametrize("clear", ["opt.zero_grad(set_to_none=False)", "model.zero_grad(set_to_none=False)",
                                   "opt.zero_grad()"])
def test_gradients_cleared_every_step_give_no_finding(clear, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOOP.format(clear=clear))
    assert diagnose_script(str(script)).findings == ()


def test_never_cleared_gradients_stepped_every_iteration_are_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOOP.format(clear="pass"))
    (f,) = diagnose_script(str(script)).findings
    assert f.code == "accumulation-steps-every-microbatch" and f.where.endswith("train.py:11")
    assert "not divided" in f.message
