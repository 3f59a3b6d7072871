"""A corpus of independent real-world-style training scripts (tests/diagnose/corpus/): argparse, Trainer
classes, DataLoader workers, helper modules, torch.compile, LSTM, transformer blocks, custom autograd
Functions; some with a planted defect (named in each docstring), some clean. Golden outputs (code and
where of every finding) live in corpus/golden/NAME.json; `UPDATE_GOLDEN=1` rewrites them.

Each run also checks that the instrumentation is invisible: no warning from ampkit's files or torch's
hook machinery, no dynamo graph break or recompile caused by it.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import pytest
import torch

from ampkit.diagnose import diagnose_script

CORPUS = Path(__file__).parent / "corpus"
SCRIPTS = sorted(p.stem for p in CORPUS.glob("*.py"))


def _cpu_dependent(name: str) -> list[dict]:
    """Findings that are right only on some CPUs: lstm_tagger's BF16 LSTM has no oneDNN kernel without
    AVX-512, so there the run fails and diagnose says so (the golden files hold the AVX-512 answer)."""
    from _cpu import lstm_runs_in  # tests/diagnose is on sys.path (rootdir import)

    if name == "lstm_tagger" and not lstm_runs_in(torch.bfloat16):
        return [{"code": "dtype-unsupported", "where": "lstm_tagger.py:18"}]
    return []


def test_corpus_is_large_and_mixed():
    planted = [s for s in SCRIPTS if "Planted:" in (CORPUS / f"{s}.py").read_text()]
    assert len(SCRIPTS) >= 10 and len(planted) >= 6 and len(SCRIPTS) - len(planted) >= 5


@pytest.mark.parametrize("name", SCRIPTS)
def test_corpus_script_matches_golden(name, monkeypatch, caplog):
    import torch._dynamo.utils as dynamo_utils

    monkeypatch.chdir(CORPUS)  # where paths are then relative: "cifar_trainer.py:34"
    dynamo_utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="torch"):
        warnings.simplefilter("always")
        result = diagnose_script(f"{name}.py")
    got = [{"code": f.code, "where": f.where} for f in result.findings]
    golden = CORPUS / "golden" / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(golden.read_text()) + _cpu_dependent(name), result.findings
    assert all(f.fix and f.message for f in result.findings)
    assert "_orig_mod" not in json.dumps([f.to_dict() for f in result.findings])
    noisy = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
             if "ampkit" in w.filename or "always_call" in str(w.message) or "global hooks" in str(w.message)
             or "_dynamo" in w.filename]
    assert noisy == []
    assert not [r.getMessage() for r in caplog.records if "recompile" in r.getMessage() or "graph break" in r.getMessage()]
    assert sum(dynamo_utils.counters["graph_break"].values()) == 0, dict(dynamo_utils.counters["graph_break"])
