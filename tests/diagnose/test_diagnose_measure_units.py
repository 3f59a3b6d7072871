"""The small pieces issue 40's judges rest on, tested directly: the FP32 measurement of an op, the constant a
loss was multiplied by, and reading the user's own source at a line (a keyword's expression, a line's code)."""

from __future__ import annotations

import torch

from ampkit.diagnose.oplocate import fp32_reference, precision_made
from ampkit.diagnose.order_checks import constant_factor
from ampkit.diagnose.source import keyword_source, line_text


def test_precision_made_only_where_fp32_is_finite():
    x = torch.tensor([1.0, 12.0, float("-inf")], dtype=torch.float16)
    out = torch.exp(x)  # [e, inf (overflow), 0 (exp(-inf))]
    assert precision_made([out], fp32_reference(torch.ops.aten.exp.default, (x,), {}))
    mask = torch.tensor([False, True, True])
    filled = torch.zeros(3, dtype=torch.float16).masked_fill(mask, float("-inf"))
    refs = fp32_reference(torch.ops.aten.masked_fill.Scalar, (torch.zeros(3, dtype=torch.float16), mask, float("-inf")), {})
    assert not precision_made([filled], refs)  # -inf by design: FP32 gives it too


def test_constant_factor_reads_the_last_multiply_or_divide():
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    assert constant_factor(loss * 1e5) == 1e5
    assert constant_factor(1e5 * loss) == 1e5
    assert constant_factor(loss / 0.01) == 100.0
    assert constant_factor(loss / 4) == 0.25
    assert constant_factor(loss + 1) is None
    assert constant_factor(loss * w.sum()) is None  # a factor that carries a gradient is no constant


def test_keyword_source_reads_the_call_at_the_line(tmp_path):
    f = tmp_path / "train.py"
    f.write_text("import torch\n"
                 "def make(is_bf16):\n"
                 "    scaler = torch.amp.GradScaler(\n"
                 "        'cuda',\n"
                 "        enabled=is_bf16)  # the inverted flag\n"
                 "    other = torch.amp.GradScaler('cuda', not is_bf16)\n"
                 "    return scaler, other\n")
    path = str(f)
    assert keyword_source(path, 3, "GradScaler", "enabled", position=1) == "is_bf16"
    assert keyword_source(path, 5, "GradScaler", "enabled", position=1) == "is_bf16"  # a line inside the call
    assert keyword_source(path, 6, "GradScaler", "enabled", position=1) == "not is_bf16"
    assert keyword_source(path, 2, "GradScaler", "enabled", position=1) is None  # the def line holds no such call
    assert line_text(path, 5) == "enabled=is_bf16)"
    assert line_text(path, 99) == ""


def test_uninitialised_memory_and_random_draws_are_not_measured():
    """dropout's `empty_like` may hold inf/NaN bits before `bernoulli_` fills it (a false overflow on minGPT in BF16
    once): ops that compute nothing from their inputs are never blamed."""
    import torch

    from ampkit.diagnose.oplocate import _computes

    aten = torch.ops.aten
    assert not any(_computes(op) for op in (aten.empty_like.default, aten.empty.memory_format,
                                            aten.bernoulli_.float, aten.uniform_.default, aten.rand_like.default))
    assert all(_computes(op) for op in (aten.mul.Tensor, aten.exp.default, aten.masked_fill.Scalar, aten.mm.default))
