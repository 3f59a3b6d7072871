"""benchmarks/mutation.py, the mutation runner: its mutants apply to today's code, its automatic mutants are
valid one-place edits, the kill rate is counted right, and (slow) a real mutant is killed in a copy of src
while the working tree stays as it was."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "benchmarks" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


mutation = _load()


def test_every_realistic_mutant_applies_once_and_names_its_tests():
    mutants = [mutation.Mutant(**m) for m in mutation._realistic()]
    assert len(mutants) >= 30 and len({m.id for m in mutants}) == len(mutants)
    for m in mutants:
        text = (mutation.SRC / "ampkit" / m.file).read_text(encoding="utf-8")
        changed = mutation.mutate_text(text, m)  # ValueError when the snippet is gone or ambiguous
        assert changed != text and m.tests and m.breaks
        ast.parse(changed)
        assert all((ROOT / t).exists() for t in m.tests if t.startswith("tests/")), m.id


def test_a_snippet_that_is_not_there_once_is_refused():
    m = mutation.Mutant(id="x", file="f.py", original="a < b", mutated="a <= b", breaks="")
    with pytest.raises(ValueError, match="occurs 2 times"):
        mutation.mutate_text("a < b\na < b\n", m)
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutation.mutate_text("a > b\n", m)


def test_automatic_mutants_are_valid_one_place_edits():
    mutants = mutation.auto_mutants("checkpoint/rotation.py")
    kinds = {(m.original, m.mutated) for m in mutants}
    assert ("streak == 0", "streak != 0") in kinds and ("streak is None", "streak is not None") in kinds
    assert ("streak is None or streak == 0", "streak is None and streak == 0") in kinds
    assert ("1", "2") in kinds  # counters[1] -> counters[2]
    text = (mutation.SRC / "ampkit" / "checkpoint" / "rotation.py").read_text(encoding="utf-8")
    for m in mutants:
        changed = mutation.mutate_text(text, m)
        ast.parse(changed)
        diff = [i for i, (a, b) in enumerate(zip(text.split("\n"), changed.split("\n"))) if a != b]
        assert diff == [m.line - 1], m.id
    assert not any(":" in m.original and "->" in m.original for m in mutants)  # annotations left alone


def test_the_kill_rate_counts_timeouts_and_leaves_out_baseline_failures():
    results = [{"id": str(i), "package": p, "file": "", "breaks": "", "tests": [], "status": s}
               for i, (p, s) in enumerate([("a", "killed"), ("a", "survived"), ("a", "timeout"), ("b", "killed"),
                                           ("b", "baseline-fails")])]
    report = mutation.summarize(results, 0.95)
    assert report["packages"]["a"] == {"mutants": 3, "killed": 1, "timeouts": 1, "survived": 1, "kill_rate": 0.6667}
    assert report["total"]["mutants"] == 4 and report["total"]["kill_rate"] == 0.75
    assert report["total"]["not_counted"] == 1 and not report["total"]["meets_bar"]
    assert [s["id"] for s in report["survivors"]] == ["1"]


def test_one_baseline_per_file_set():
    groups = mutation._baseline_groups([("t.py", "-k", "a"), ("t.py", "-k", "b"), ("u.py",), ("u.py", "-k", "c")])
    assert groups == {("t.py", "-k", "(a) or (b)"): [("t.py", "-k", "a"), ("t.py", "-k", "b")],
                      ("u.py",): [("u.py",), ("u.py", "-k", "c")]}


def _tree_digest() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted((ROOT / "src").rglob("*.py")))).hexdigest()


@pytest.mark.slow
def test_a_real_mutant_is_killed_in_a_copy_and_an_equivalent_one_survives():
    before = _tree_digest()
    real = mutation.Mutant(id="total", file="checkpoint/rotation.py", original="return int(counters[1])",
                           mutated="return int(counters[0])", breaks="", tests=["tests/test_checkpoint_rotation.py"])
    same = mutation.Mutant(id="same", file="checkpoint/rotation.py", original="return int(counters[1])",
                           mutated="return int(counters[1 ])", breaks="", tests=["tests/test_checkpoint_rotation.py"])
    report = mutation.run([real, same], timeout_s=300, bar=0.95, log=lambda s: None)
    assert [r["status"] for r in report["results"]] == ["killed", "survived"]
    assert "test_good_reads_the_consecutive_skips_not_the_total" in report["results"][0]["failed"]
    assert _tree_digest() == before
