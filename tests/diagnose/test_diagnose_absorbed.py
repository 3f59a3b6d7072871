"""Issue 14, diagnose part: FP16 overflow absorbed inside a module, found at run time (op watch) and
predicted by --fp16-range from the FP32 run, with the exact flags to use."""

from __future__ import annotations

import os

from ampkit.cli import main
from ampkit.diagnose import diagnose_script, fp16_range_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def script(name: str) -> str:
    return os.path.join(SCRIPTS, f"{name}.py")


def test_absorbed_overflow_names_module_op_flag_and_init_scale():
    result = diagnose_script(script("overflow_absorbed"))
    assert result.codes() == ["overflow-absorbed"], result.findings
    f = result.findings[0]
    assert f.where == "model.1 · " + os.path.relpath(script("overflow_absorbed")) + ":11"  # the op's own line
    assert "overflow: in FP32 the result reaches" in f.message and "called at" in f.message
    assert "model.1 (HandNorm)" in f.message and "aten.pow" in f.message and "float16" in f.message
    assert "`ampkit train --fp32-modules 1`" in f.fix and 'fp32_modules=["1"]' in f.fix
    assert "`--init-scale 16384`" in f.fix  # where the GradScaler settled (and what --fp16-range recommends)
    assert f.step == 0


def test_absorbed_clean_twin_is_silent():
    result = diagnose_script(script("overflow_absorbed_clean"))
    assert result.findings == () and result.error is None


def test_fp16_range_predicts_the_absorbed_overflow_from_fp32():
    report, error = fp16_range_script(script("overflow_absorbed"), steps=3)
    assert error is None and report.steps == 3
    assert report.keep_fp32 == ("model.1",) and report.fp32_modules == ("1",)
    assert report.overflow == ()  # no module OUTPUT exceeds 65504: watching outputs alone misses it
    (pow_,) = [o for o in report.op_overflow if o.op == "aten.pow"]
    assert pow_.module == "model.1" and pow_.max > 65504 and pow_.absorbed


def test_fp16_range_sees_an_overflow_between_ops_inside_attention(capsys):
    rc = main(["diagnose", "--fp16-range", "--steps", "2", script("attention_overflow")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "model.attn: `aten.bmm` reaches" in out
    assert "--fp32-modules attn --init-scale" in out and 'fp32_modules=["attn"]' in out
    report, _ = fp16_range_script(script("attention_overflow"), steps=2)
    assert report.keep_fp32 == ("model.attn",) and report.overflow == ()
    assert "aten._unsafe_view" not in {o.op for o in report.op_overflow}  # a reshape is not a new value


def test_diagnose_names_the_attention_block_not_a_later_submodule():
    # In FP16 the scores overflow between the block's submodules; the first module whose INPUT is
    # non-finite is attn.o, but the op watch names the block whose own forward ran the matmul.
    result = diagnose_script(script("attention_overflow"))
    (f,) = result.findings
    assert f.code == "nonfinite-forward" and f.where.startswith("model.attn ")
    assert "aten.bmm" in f.message and "--fp32-modules attn" in f.fix
    assert "--fp16-range" in f.fix and "--init-scale X" in f.fix  # the FP16 run cannot measure it
