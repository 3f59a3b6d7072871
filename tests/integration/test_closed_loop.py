"""Issue 14's closed loop, end to end through the commands a user types: a script whose hand-written
normalisation overflows FP16 inside the module (the loss stays finite, the scaler never skips) ->
``ampkit diagnose`` names the module and prints the flag -> ``ampkit train`` with that flag -> ``ampkit
compare`` with that flag passes, where it fails without it."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from ampkit.cli import main

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = os.path.join(HERE, "verify", "overflow_norm_task.py") + ":make_task"

SCRIPT = textwrap.dedent(f"""
    # A user's FP16 training script on the planted task: torch.amp by hand, nothing of ampkit's engine.
    import torch
    import ampkit

    task = ampkit.load_task({TASK!r})
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        x, y = task.batch(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = task.loss(model, (x, y))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
""")


@pytest.fixture(scope="module")
def flag(tmp_path_factory):
    """What `ampkit diagnose` tells the user to pass to `ampkit train`."""
    folder = tmp_path_factory.mktemp("loop")
    script = folder / "train_fp16.py"
    script.write_text(SCRIPT)
    report = folder / "findings.json"
    main(["diagnose", "--json", str(report), str(script)])
    findings = json.loads(report.read_text())
    absorbed = [f for f in findings if f["code"] == "overflow-absorbed"]
    assert absorbed, findings
    match = re.search(r"`ampkit train --fp32-modules (\S+?)`", absorbed[0]["fix"])
    assert match, absorbed[0]["fix"]
    return match.group(1)


def test_diagnose_names_the_norm(flag):
    assert flag == "norm"


def test_train_with_the_flag_keeps_the_norm_in_fp32(flag, tmp_path, capsys):
    assert main(["train", "--task", TASK, "--precision", "fp16", "--steps", "3", "--fp32-modules", flag,
                 "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("FP32 regions: norm" in n for n in out["notes"]), out["notes"]


@pytest.mark.slow  # 31 s on the busy 2-core machine (--durations)
def test_compare_fails_without_the_flag_and_passes_with_it(flag, tmp_path, capsys):
    args = ["compare", "--task", TASK, "--precision", "fp16", "--seeds", "2", "--steps", "20", "--no-audit"]
    assert main([*args, "--out", str(tmp_path / "without")]) == 1
    assert main([*args, "--fp32-modules", flag, "--out", str(tmp_path / "with")]) == 0
    data = json.loads((tmp_path / "with" / "compare.json").read_text())
    assert data["verdict"] == "pass" and data["fp32_modules"] == [flag]


def test_train_checkpoints_record_the_regions(flag, tmp_path, capsys):
    # ampkit train installs --fp32-modules through the engine (amp.attach): its checkpoint says which.
    from ampkit.checkpoint import load_checkpoint

    assert main(["train", "--task", TASK, "--precision", "fp16", "--steps", "2", "--fp32-modules", flag,
                 "--out", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    (path,) = sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1:]
    assert load_checkpoint(path)["amp"]["fp32_modules"] == [flag]
