"""The checker behind test_ported_scripts.py: it must pass what is harmless and catch every cuda that is not."""

from __future__ import annotations

import pytest

from .cuda_accounting import account, reported_lines, unaccounted

HARMLESS = '''"""Trains on CUDA (a docstring)."""
import argparse
import torch

# a comment about cuda
parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
args = parser.parse_args()
use_cuda = not args.no_cuda and torch.musa.is_available()
cuda_kwargs = {"pin_memory": True}
print("WARNING: You have a CUDA device")
if hasattr(torch, "autocast"):
    ok = torch.cuda.is_available()  # a feature fallback: migrate leaves it alone
if device_type == "cuda":
    torch.cuda.synchronize()
elif device_type == "musa":
    torch.musa.synchronize()
backend = {"cuda": "nccl", "musa": "mccl"}[device_type]
'''


def test_harmless_mentions_are_accounted_for():
    mentions = account(HARMLESS)
    assert not unaccounted(mentions), "\n".join(map(str, unaccounted(mentions)))
    kinds = {m.kind for m in mentions}
    assert {"docstring", "comment", "argparse flag", "prose", "user name", "device string", "torch api"} <= kinds
    assert any(m.accounted and "fallback" in m.accounted for m in mentions)
    assert any(m.accounted and "dispatcher" in m.accounted for m in mentions)


@pytest.mark.parametrize("line", [
    "torch.cuda.utilization()",
    "torch.backends.cuda.matmul.allow_tf32 = True",
    "x = torch.zeros(2, device='cuda')",
    "x = x.cuda()",
    "ok = x.is_cuda",
    "v = torch.version.cuda",
    "device = f'cuda:{rank}'",
    "dist.init_process_group('nccl')",
    "ok = dist.is_nccl_available()",
    "os.environ['CUDA_VISIBLE_DEVICES'] = '0'",
    "from torch.cuda.amp import GradScaler",
    "import torch.cuda",
    "th.cuda.synchronize()",
    "with torch.cuda.device(0): pass",
])
def test_torch_cuda_left_unreported_is_caught(line):
    source = f"import os\nimport torch\nimport torch as th\nimport torch.distributed as dist\n{line}\n"
    bad = unaccounted(account(source))
    assert bad and {m.line for m in bad} == {5}, bad
    assert not unaccounted(account(source, original=source, reported={5}))  # reported by migrate: fine


def test_a_dispatcher_must_name_musa_in_its_own_tests():
    """An if block that only mentions musa somewhere deeper is not a dispatcher: its cuda is caught."""
    source = "import torch\nif use_gpu:\n    torch.cuda.synchronize()\n    x = 1\n    for i in 'musa':\n        pass\n"
    assert [m.line for m in unaccounted(account(source))] == [3]


def test_reported_lines_follow_the_port():
    """migrate reports lines of the file it read; a line added by the port shifts the rest."""
    original = "import torch\nx = torch.cuda.utilization()\n"
    ported = "import torch\nimport torch_musa  # added\nx = torch.cuda.utilization()\n"
    out = ("t.py:2: deprecated-amp-api could not port: ... [manual fix]\n"
           "could not port (no twin): 1 in 1 file(s): t.py:2\n")
    assert reported_lines(out, "t.py") == {2}
    assert reported_lines(out, "other.py") == set()
    assert not unaccounted(account(ported, original=original, reported={2}))
    assert [m.line for m in unaccounted(account(ported, original=original, reported={3}))] == [3]
