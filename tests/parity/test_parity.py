"""ampkit parity: every op of a script's first step against an FP64 reference, judged by its dtype's bound.

The "device" with a wrong kernel is the CPU with one aten kernel replaced for the script's dtypes
(faulty_device.py): no second device is reachable here. The FP64 replay keeps the correct kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ampkit.errors import UsageError
from ampkit.parity import parity_script
from ampkit.parity.bounds import excess

HERE = Path(__file__).parent


def _line(text: str, script: str = "attention_lm.py") -> str:
    lines = (HERE / script).read_text().splitlines()
    return f"{script}:{next(i for i, l in enumerate(lines, 1) if text in l)}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_correct_kernels_give_no_report(dtype, monkeypatch):
    monkeypatch.chdir(HERE)
    r = parity_script("attention_lm.py", ["--dtype", dtype])
    assert r.same and r.ops_checked > 50 and r.worst_ratio < 0.5, (r.first, r.worst_ratio)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_torch_transformer_layer_in_low_precision_against_fp64_gives_no_report(dtype, monkeypatch):
    monkeypatch.chdir(HERE)
    r = parity_script("encoder_block.py", [dtype])
    assert r.same and r.ops_checked > 50, (r.first, r.worst_ratio, r.not_replayable)


def test_an_off_by_one_softmax_is_caught_at_its_op_and_line(monkeypatch):
    monkeypatch.chdir(HERE)
    r = parity_script("faulty_device.py", ["softmax-off-by-one", "attention_lm.py"])
    assert not r.same and r.first is not None
    assert (r.first.op, r.first.where, r.first.module, r.first.phase) == \
        ("aten._softmax", _line("F.softmax(scores"), "attn", "forward")
    assert r.first.ratio > 10
    assert torch.softmax(torch.tensor([0.0, 1.0]), 0)[1] > 0.7  # the kernel was put back afterwards


def test_a_reduction_that_drops_an_element_is_caught_at_its_line(monkeypatch):
    monkeypatch.chdir(HERE)
    r = parity_script("faulty_device.py", ["sum-drops-last", "attention_lm.py", "--dtype", "fp16"])
    assert (r.first.op, r.first.where) == ("aten.sum", _line("x.sum(-1"))
    assert torch.ones(3).sum(-1) == 3


def test_an_unreachable_reference_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ampkit", "parity", "--against", "cuda:3", str(HERE / "attention_lm.py")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "--against cuda:3: that device is not reachable" in proc.stderr
    with pytest.raises(UsageError, match="script not found"):
        parity_script(str(tmp_path / "missing.py"))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 24), k=st.integers(1, 300), n=st.integers(1, 24), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), shift=st.floats(-50, 50))
def test_the_cpu_matmul_is_always_within_its_bound(m, k, n, seed, dtype, shift):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) + shift).to(dtype)  # a shift makes large terms that cancel
    b = torch.randn(k, n, generator=g).to(dtype)
    out = torch.mm(a, b)
    ref = torch.mm(a.double(), b.double())
    ratio, _ = excess("mm", out, ref, torch.mm(a.double().abs(), b.double().abs()), (a, b), on_cpu=True)
    assert ratio <= 1.0


def test_a_result_off_by_a_few_percent_is_reported_and_one_rounding_is_not():
    ref = torch.linspace(-3, 3, 101, dtype=torch.float64)
    rounded = ref.to(torch.bfloat16)
    assert excess("gelu", rounded, ref, None, (rounded,), on_cpu=True)[0] <= 1
    assert excess("gelu", (ref * 1.03).to(torch.bfloat16), ref, None, (rounded,), on_cpu=True)[0] > 1


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_is_compared_with_torch_math_attention(causal):
    from ampkit.parity.recorder import sdpa_reference

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    for name, args in (("_scaled_dot_product_flash_attention", (q, k, v, 0.0, causal)),
                       ("_scaled_dot_product_efficient_attention", (q, k, v, None, False, 0.0, causal))):
        got = sdpa_reference(name, args, {}, torch.device("cpu"))
        assert got.dtype == torch.float64 and torch.allclose(got, want, atol=1e-12)
    assert sdpa_reference("_scaled_dot_product_flash_attention", (q, k, v, 0.1, causal), {}, torch.device("cpu")) is None
