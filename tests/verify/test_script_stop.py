"""A SCRIPT comparison with a run that a signal stopped is not judged: no verdict, nothing written, the CLI's
"stopped by SIGINT ... no verdict was written" and 130 (not the script's "error" and exit 2). Fast: the run's
child in this process (the fixture of test_script_compare_fast.py); the script takes the Ctrl-C at step 3."""

from __future__ import annotations

import pytest

from ampkit.verify.interrupt import Interrupted
from ampkit.verify.script_compare import compare_script
from test_script_compare_fast import in_process  # noqa: F401 (a fixture)

CTRL_C = """
import sys
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
for step in range(6):
    if step == 2 and "--stop" in sys.argv:
        raise KeyboardInterrupt  # what Ctrl-C raises in the script
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("first_step", [False, True], ids=["mid-run", "before-a-step"])
def test_a_run_stopped_by_a_signal_gets_no_verdict(tmp_path, in_process, first_step):
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C.replace("step == 2", "step == 0") if first_step else CTRL_C)
    with pytest.raises(Interrupted, match="stopped by SIGINT during the AMP run of seed 0") as info:  # AMP runs first
        compare_script(str(script), ["--stop"], seeds=2, run_audit=False, out=tmp_path / "o")
    assert info.value.exit_code == 130
    assert not (tmp_path / "o" / "compare.json").exists() and not (tmp_path / "o" / "report.html").exists()
    if not first_step:
        assert compare_script(str(script), seeds=2, run_audit=False).steps == 6  # the same script, not stopped
