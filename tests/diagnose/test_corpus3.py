"""The third corpus (tests/diagnose/corpus3/, issue 40): scripts written fresh, the way public repositories
write them, each planted defect marked on its line (`# expect: CODE`) with a clean twin (`NAME_clean.py`).
It covers what diagnose must decide by measuring: -inf masks that are no overflow (nanoGPT's attention in
FP16 and in BF16), the first op precision really made inf (a naive softmax's `exp`, not the mask's line),
the order of a loop's calls (zero_grad between backward and step, a scheduler stepped per micro-batch, a
hand-rolled static loss scale), and fixes that read the code they name (a GradScaler disabled by its own
flag, weights made FP16 by `.data.half()` in a helper).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ampkit.diagnose import diagnose_script

CORPUS = Path(__file__).parent / "corpus3"
SCRIPTS = sorted(p.stem for p in CORPUS.glob("*.py"))
MARK = re.compile(r"#\s*expect:\s*([a-z0-9-]+)")
PLANTED = [s for s in SCRIPTS if MARK.search((CORPUS / f"{s}.py").read_text())]
CLEAN = [s for s in SCRIPTS if s not in PLANTED]


def expectations(name: str) -> list[tuple[str, str]]:
    lines = (CORPUS / f"{name}.py").read_text().splitlines()
    return [(m[1], f"{name}.py:{i}") for i, text in enumerate(lines, 1) if (m := MARK.search(text))]


def line_of(where: str) -> str:
    found = re.search(r"([\w./-]+\.py:\d+)", where.split(" · ", 1)[-1])
    return found[1] if found else where


def test_corpus3_pairs_every_planted_script_with_a_clean_twin():
    assert len(PLANTED) >= 6
    for name in PLANTED:
        assert f"{name}_clean" in CLEAN, name
    assert {"nanogpt_attn_fp16_clean", "nanogpt_attn_bf16_clean"} <= set(CLEAN)


@pytest.mark.parametrize("name", PLANTED)
def test_planted_defect_found_with_its_code_at_its_line(name, monkeypatch):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script(f"{name}.py")
    got = [(f.code, line_of(f.where)) for f in result.findings]
    assert got == expectations(name), [f.to_dict() for f in result.findings]
    assert all(f.fix and f.message for f in result.findings)


@pytest.mark.parametrize("name", CLEAN)
def test_clean_twin_has_no_finding(name, monkeypatch):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script(f"{name}.py")
    assert result.findings == () and result.checked and result.error is None, result.findings


def _only(name: str, monkeypatch):
    monkeypatch.chdir(CORPUS)
    (f,) = diagnose_script(f"{name}.py").findings
    return f


def test_naive_softmax_is_blamed_on_its_exp_measured_in_fp32(monkeypatch):
    f = _only("naive_softmax_attn", monkeypatch)
    assert "`aten.exp` (float16)" in f.message and "in FP32 the result reaches" in f.message
    assert "masked_fill" not in f.message


def test_disabled_scaler_fix_quotes_its_own_flag(monkeypatch):
    f = _only("scaler_disabled_flag", monkeypatch)
    assert "your GradScaler at scaler_disabled_flag.py:26 is created with `enabled=is_bf16`" in f.fix
    assert "create `scaler" not in f.fix


def test_data_half_fix_points_at_the_helper_line(monkeypatch):
    f = _only("data_half_helper", monkeypatch)
    assert "remove the cast to FP16 at data_half_helper.py:15 (`m.weight.data = m.weight.data.half()`)" in f.fix
    assert "model.half()" not in f.fix


def test_zero_grad_finding_explains_the_scaler_crash(monkeypatch):
    monkeypatch.chdir(CORPUS)
    result = diagnose_script("zero_grad_after_backward.py")
    assert result.codes() == ["zero-grad-between-backward-and-step"]  # no script-error for the assertion it causes
    assert "No inf checks were recorded" in (result.error or "")


def test_scheduler_finding_counts_the_calls_per_step(monkeypatch):
    f = _only("scheduler_per_microbatch", monkeypatch)
    assert "ran 4 times between two steps" in f.message


def test_inf_that_fp32_gives_too_is_named_but_not_blamed_on_precision(monkeypatch):
    f = _only("masked_row_nan", monkeypatch)
    assert "`aten.masked_fill` (float16)" in f.message and "precision did not cause it" in f.message
    assert "--fp32-modules" not in f.fix and "BF16" not in f.fix


def test_bf16_weights_whose_updates_survive_are_not_reported(tmp_path, monkeypatch):
    # Pure BF16 by design is fine when the updates are large enough to survive rounding: measured, not assumed.
    text = (CORPUS / "bf16_pure_weights.py").read_text()
    text = text.replace("lr=1e-5", "lr=1e-1").replace("  # expect: bf16-weights-without-master", "")
    (tmp_path / "bf16_large_lr.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert diagnose_script("bf16_large_lr.py").findings == ()
