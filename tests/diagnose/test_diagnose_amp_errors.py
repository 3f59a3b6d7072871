"""torch's own AMP errors become AMP advice, the cause of a non-finite value is named with its numbers,
and `--json` to a place that cannot be written fails before the script runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ampkit.cli import main
from ampkit.diagnose import diagnose_script
from ampkit.diagnose.oplocate import CANCELLATION, OVERFLOW, UNDERFLOW, classify

CORPUS2 = Path(__file__).parent / "corpus2"


def _torch_bce_refusal() -> str:
    """The exact message CUDA/MUSA autocast raises for binary_cross_entropy, read from torch's own library
    (the CPU build carries the same check text; CPU autocast runs the op in FP32 instead of raising)."""
    lib = Path(torch.__file__).parent / "lib"
    for so in sorted(lib.glob("libtorch_cpu*")):
        data = so.read_bytes()
        i = data.find(b"torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast")
        if i >= 0:
            return data[i:data.find(b"\x00", i)].decode()
    pytest.skip("torch's BCE autocast message is not in this build's library")


def test_torch_bce_refusal_is_mapped_to_its_code_by_the_runner(tmp_path):
    # On an accelerator torch raises this from F.binary_cross_entropy under autocast; here the script raises
    # the same RuntimeError, so only the runner's mapping (not the BCE wrapper) can name the code.
    script = tmp_path / "vae.py"
    script.write_text(f"import torch\nmsg = {_torch_bce_refusal()!r}\n\n\nraise RuntimeError(msg)\n")
    result = diagnose_script(str(script))
    assert result.codes() == ["bce-under-autocast"], result.findings
    assert result.findings[0].where.endswith("vae.py:5") and "BCEWithLogitsLoss" in result.findings[0].fix


def test_scaler_step_twice_without_update_is_mapped(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n"
        "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu')\n"
        "for _ in range(2):\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        loss = model(torch.randn(8, 4)).float().pow(2).mean()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n")
    result = diagnose_script(str(script))
    assert result.codes() == ["scaler-update-missing"], result.findings
    assert result.findings[0].where.endswith("train.py:10")
    assert "step() has already been called since the last update()" in result.findings[0].message


def test_unscale_after_step_in_one_iteration_is_not_called_a_missing_update(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n"
        "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu')\n"
        "with torch.autocast('cpu', dtype=torch.float16):\n"
        "    loss = model(torch.randn(8, 4)).float().pow(2).mean()\n"
        "scaler.scale(loss).backward()\n"
        "scaler.step(opt)\n"
        "scaler.unscale_(opt)\n")
    assert diagnose_script(str(script)).codes() == ["script-error"]


@pytest.mark.parametrize("name, words", [
    ("attn_mask_fp16", ["overflow: the constant -1e+09 does not fit float16", "65504"]),
    ("layernorm_eps_fp16", ["underflow: the constant 1e-12 at layernorm_eps_fp16.py:23", "0/0"]),
    ("softmax_sum_overflow", ["`aten.sum` (float16)", "overflow: in FP32 the result reaches", "65504"]),
    ("stats_pool_eps", ["underflow: the constant 1e-12 at stats_pool_eps.py:23", "SqrtBackward0",
                        "not the loss scale"]),
])
def test_the_message_says_why_with_the_numbers(name, words, monkeypatch):
    monkeypatch.chdir(CORPUS2)
    (f,) = diagnose_script(f"{name}.py").findings
    assert all(w in f.message for w in words), f.message
    assert "largest finite value is 65504" not in f.message or "overflow" in f.message


def test_classify_names_overflow_underflow_and_cancellation():
    h = torch.float16
    big = torch.full((4,), 300.0, dtype=h)
    assert classify(torch.ops.aten.mul.Tensor, (big, big), {}, big * big)[0] == OVERFLOW
    zero = torch.zeros(4, dtype=h)
    cause, detail = classify(torch.ops.aten.div.Tensor, (zero, zero), {}, zero / zero)
    assert cause != UNDERFLOW and "divides by 0" in detail  # no constant rounded to 0: not called an underflow
    neg = torch.tensor([-1e-3, 4.0], dtype=h)
    cause, detail = classify(torch.ops.aten.sqrt.default, (neg,), {}, neg.sqrt())
    assert cause == CANCELLATION and "-0.001" in detail


def test_json_to_an_unwritable_place_fails_before_the_script_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    for target in (tmp_path / "no-such-folder" / "f.json", tmp_path):
        assert main(["diagnose", "--json", str(target), str(script)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "cannot write --json" in err and "Traceback" not in err
        assert not marker.exists()
    existing = tmp_path / "keep.json"
    existing.write_text("[1]")
    assert main(["diagnose", "--fp16-range", "--json", str(tmp_path / "nope" / "r.json"), str(script)]) == 2
    assert not marker.exists() and existing.read_text() == "[1]"
    assert main(["diagnose", "--json", str(tmp_path / "out.json"), str(script)]) == 3  # ran: nothing checked
    assert marker.exists() and os.path.exists(tmp_path / "out.json")


@pytest.mark.parametrize("name, first", [("attn_mask_fp16", "use a constant the low-precision dtype holds"),
                                         ("layernorm_eps_fp16", "use an eps the low-precision dtype holds"),
                                         ("stats_pool_eps", "use an eps the low-precision dtype holds")])
def test_the_fix_starts_with_the_cause(name, first, monkeypatch):
    monkeypatch.chdir(CORPUS2)
    (f,) = diagnose_script(f"{name}.py").findings
    assert f.fix.startswith(first), f.fix
