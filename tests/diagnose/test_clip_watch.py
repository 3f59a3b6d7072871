"""A hand-written clip (by norm, total norm or value) of gradients still multiplied by the loss scale is measured (clip_watch.py): found at
the loop's line when the clip's threshold acted on scaled norms; not for a clip after `unscale_`, nor for a
division of the scaled gradients by a constant."""

from __future__ import annotations

import pytest

from ampkit.diagnose import diagnose_script

LOOP = (
    "import torch\nimport torch.nn as nn\n"
    "def per_param_clip(model, clip):\n"
    "    for p in model.parameters():\n"
    "        coef = clip / (p.grad.data.norm(2) + 1e-6)\n"
    "        if coef < 1:\n"
    "            p.grad.data.mul_(coef)\n"
    "def total_clip(model, clip):\n"
    "    norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()\n"
    "    for p in model.parameters():\n"
    "        p.grad.mul_(torch.clamp(clip / (norm + 1e-6), max=1.0))\n"
    "def average(model, world):\n"
    "    for p in model.parameters():\n"
    "        p.grad.div_(world)\n"
    "def value_clip(model, clip):\n"
    "    for p in model.parameters():\n"
    "        p.grad.data.clamp_(min=-clip, max=clip)\n"
    "torch.manual_seed(0)\n"
    "model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "scaler = torch.amp.GradScaler('cpu')\n"
    "for i in range(4):\n"
    "    opt.zero_grad()\n"
    "    with torch.autocast('cpu', dtype=torch.float16):\n"
    "        loss = model(torch.randn(8, 16)).float().pow(2).mean()\n"
    "    scaler.scale(loss).backward()\n"
    "    {before}\n"
    "    {call}\n"
    "    scaler.step(opt)\n"
    "    scaler.update()\n")


@pytest.mark.parametrize("call", ["per_param_clip(model, 3.0)", "total_clip(model, 1.0)", "value_clip(model, 0.5)"])
def test_a_hand_written_clip_before_unscale_is_found_at_its_call(call, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOOP.format(before="pass", call=call))
    (f,) = diagnose_script(str(script)).findings
    assert f.code == "clip-before-unscale" and f.where.endswith("train.py:28")
    assert "would not have been clipped" in f.message and "65536" in f.message


@pytest.mark.parametrize("before,call", [("scaler.unscale_(opt)", "per_param_clip(model, 3.0)"),
                                         ("scaler.unscale_(opt)", "total_clip(model, 1.0)"),
                                         ("scaler.unscale_(opt)", "value_clip(model, 0.5)"),
                                         ("pass", "average(model, 4)")])
def test_a_clip_after_unscale_or_a_division_is_not_reported(before, call, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOOP.format(before=before, call=call))
    assert diagnose_script(str(script)).findings == ()


def test_under_gradient_accumulation_the_clip_after_the_last_backward_is_measured(tmp_path):
    # the watch ends at each micro-batch's forward and restarts after its backward
    loop = LOOP.replace("for i in range(4):\n", "for i in range(4):\n  for k in range(2):\n").replace(
        "    opt.zero_grad()\n", "    pass\n").replace("    scaler.scale(loss).backward()\n",
                                                     "    scaler.scale(loss).backward()\n  if True:\n").replace(
        "    scaler.update()\n", "    scaler.update()\n    opt.zero_grad()\n")
    script = tmp_path / "train.py"
    script.write_text(loop.format(before="pass", call="per_param_clip(model, 3.0)"))
    (f,) = diagnose_script(str(script)).findings
    assert f.code == "clip-before-unscale" and f.where.endswith("train.py:30")
