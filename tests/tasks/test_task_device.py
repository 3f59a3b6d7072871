"""Every command builds the task for the device it runs on: a factory with a ``device`` parameter gets it.

The factory below writes the device it was given to a file, so the test sees what each command passed.
"""

from __future__ import annotations

import pytest

from ampkit.cli import main

FACTORY = '''
import ampkit
from ampkit.tasks import digits

def make_task(seed: int = 0, record: str = "", device=None):
    with open(record, "a") as fh:
        fh.write(f"{device}\\n")
    return digits.make_task(seed=seed, hidden=8, channels=2, batch_size=8, device=device)
'''


@pytest.mark.parametrize("argv", [
    ["train", "--steps", "2"],
    ["compare", "--steps", "2", "--seeds", "1", "--no-audit"],
    ["audit"],
    ["bench", "--steps", "1", "--warmup", "0", "--runners", "plain", "--precision", "bf16"],
], ids=["train", "compare", "audit", "bench"])
def test_each_command_passes_its_device_to_the_task(argv, tmp_path, capsys):
    factory = tmp_path / "devtask.py"
    factory.write_text(FACTORY)
    record = tmp_path / "devices.txt"
    flag = "--model" if argv[0] == "bench" else "--task"
    extra = ["--out", str(tmp_path / ("out.json" if argv[0] == "bench" else "out"))] if argv[0] != "audit" else []
    rc = main([*argv, flag, f"{factory}:make_task", "--task-arg", f"record={record}", "--device", "cpu", *extra])
    assert rc == (3 if argv[0] == "compare" else 0), capsys.readouterr()  # one seed: inconclusive, never a pass
    seen = set(record.read_text().split())
    assert seen == {"cpu"}, seen
