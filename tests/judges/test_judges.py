"""The judges' corpus (tests/judges/corpus/) and its harness (benchmarks/judges.py) are right.

These tests check the harness, not today's diagnose and migrate: the truth tables parse and point at real
lines, each planted script really shows its defect when run plainly and each clean one trains to a finite
loss without it, the scoring counts what it says, and the fast subset runs end to end and reports its
numbers. How good diagnose and migrate are on the corpus is what benchmarks/judges.py measures.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERMISSIVE = {"MIT", "BSD-3-Clause", "Apache-2.0"}
# Codes agreed for issue 40 (briefs' codes.md) that the diagnose work adds to the registry in parallel.
AGREED_NEW_CODES = {"static-loss-scale", "zero-grad-between-backward-and-step", "scheduler-every-microbatch",
                    "bf16-weights-without-master"}
PLANTED_MARK = re.compile(r"#\s*planted:\s*([a-z0-9-]+)")


def _judges():
    spec = importlib.util.spec_from_file_location("judges", ROOT / "benchmarks" / "judges.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["judges"] = module
    spec.loader.exec_module(module)
    return module


judges = _judges()
DIAGNOSE_CASES = judges.load_diagnose_cases()
MIGRATE_FILES, ABSENT = judges.load_migrate_cases()
FAST = [c["name"] for c in DIAGNOSE_CASES if c.get("fast")]
SLOW = [c["name"] for c in DIAGNOSE_CASES if not c.get("fast")]


def _case(name: str) -> dict:
    return next(c for c in DIAGNOSE_CASES if c["name"] == name)


def test_diagnose_truth_table_points_at_the_planted_lines():
    from ampkit.findings import codes

    known = set(codes("diagnose")) | AGREED_NEW_CODES
    names = {c["name"] for c in DIAGNOSE_CASES}
    for case in DIAGNOSE_CASES:
        lines = (judges.DIAGNOSE / case["file"]).read_text(encoding="utf-8").splitlines()
        marked = [{"code": m[1], "line": i} for i, text in enumerate(lines, 1) if (m := PLANTED_MARK.search(text))]
        assert marked == case["expect"], case["name"]  # the table and the file's marks agree
        assert all(item["code"] in known for item in case["expect"]), case["name"]
        if case["kind"] == "planted":
            assert case["twin"] in names and _case(case["twin"])["kind"] == "clean", case["name"]
    planted = [c for c in DIAGNOSE_CASES if c["kind"] == "planted"]
    assert len(planted) >= 10 and len(DIAGNOSE_CASES) - len(planted) >= 15
    assert {"static-loss-scale", "zero-grad-between-backward-and-step", "scheduler-every-microbatch",
            "fp16-without-scaler", "clip-before-unscale", "bce-under-autocast", "nonfinite-forward"} <= {
        item["code"] for c in planted for item in c["expect"]}


def test_every_case_records_where_it_comes_from():
    sources = [c["source"] for c in DIAGNOSE_CASES] + [e["source"] for e in MIGRATE_FILES]
    for source in sources:
        assert source["license"] in PERMISSIVE and source["repo"].count("/") == 1 and source["path"], source
        assert source.get("installed") or re.fullmatch(r"[0-9a-f]{40}", source["commit"]), source
    assert len({s["repo"] for s in sources}) >= 20


def test_migrate_truth_table_lists_every_vendor_line():
    for entry in MIGRATE_FILES:
        lines = (judges.MIGRATE / entry["file"]).read_text(encoding="utf-8").splitlines()
        assert set(entry["targets"]) == {"musa", "agnostic"}, entry["file"]
        listed = {row["line"] for row in entry["targets"]["musa"]}
        for number, text in enumerate(lines, 1):
            code = text.split("#", 1)[0]
            if re.search(r"(?i)cuda|nccl", code):
                assert number in listed, f"{entry['file']}:{number} names a vendor but is not in the musa table"
    rows = [row for e in MIGRATE_FILES for rows in e["targets"].values() for row in rows]
    assert len(MIGRATE_FILES) >= 10 and sum(r["expect"] == "port" for r in rows) >= 50
    assert {"report-only", "keep", "report"} <= {r["expect"] for r in rows}


def test_a_truth_row_that_does_not_fit_its_line_is_refused(tmp_path, monkeypatch):
    doc = json.loads((judges.MIGRATE / "cases.json").read_text(encoding="utf-8"))
    for entry in doc["files"]:
        (tmp_path / entry["file"]).write_text((judges.MIGRATE / entry["file"]).read_text(encoding="utf-8"))
    doc["files"][0]["targets"]["musa"][0]["line"] += 1
    (tmp_path / "cases.json").write_text(json.dumps(doc))
    monkeypatch.setattr(judges, "MIGRATE", tmp_path)
    with pytest.raises(judges.CorpusError, match="does not contain"):
        judges.load_migrate_cases()


def test_diagnose_scoring():
    case = {"file": "x.py", "kind": "planted", "expect": [{"code": "nonfinite-forward", "line": 7}]}
    at = lambda code, where: {"code": code, "where": where}  # noqa: E731
    assert judges.score_diagnose(case, [at("nonfinite-forward", "model.attn · x.py:7")])["outcomes"] == ["right"]
    assert judges.score_diagnose(case, [at("nonfinite-forward", "model.attn · x.py:9")])["outcomes"] == ["right-code"]
    wrong = judges.score_diagnose(case, [at("overflow-absorbed", "x.py:7"), at("script-error", "y.py:7")])
    assert wrong["outcomes"] == ["wrong-code"] and wrong["extra"] == 2
    assert judges.score_diagnose(case, [])["outcomes"] == ["missed"]
    clean = dict(case, kind="clean", expect=[])
    assert judges.score_diagnose(clean, [at("overflow-absorbed", "x.py:3")])["false_findings"] == 1
    assert judges.finding_line("model.h.0 · sub/x.py:12", "x.py") == 12 and judges.finding_line("y.py:3", "x.py") is None


def test_migrate_scoring():
    before = "a = 'cuda'\nb = 'cuda'\nc = 1\nprint('on cuda')\nd = 'cuda'\ne = 'cuda'\nf = 2\n"
    after = "import x\na = 'musa'\nb = 'cuda:0'\nc = 1\nprint('on musa')\nd = 'cuda'\ne = 'musa'\nf = 3\n"
    rows = [{"line": 1, "expect": "port"}, {"line": 2, "expect": "port"}, {"line": 3, "expect": "port"},
            {"line": 4, "expect": "keep"}, {"line": 5, "expect": "report-only"}, {"line": 6, "expect": "report-only"}]
    findings = [{"line": 3}, {"line": 5}, {"line": 6}]
    got = judges.score_migrate(rows, ABSENT["musa"], before, after, findings)
    assert [r["outcome"] for r in got["rows"]] == ["right", "wrong", "reported", "wrong", "right", "wrong"]
    assert got["unexpected"] == [7]  # f = 2 -> 3 is listed nowhere; the inserted import belongs to no line
    assert judges.changed_lines("x\ny\nv\n", "x\nz\nw\n\n") == {2: "z", 3: "w"}
    assert judges.changed_lines("a = 1\nb = 2\n", "import q\na = 1\nb = 3\n") == {2: "b = 3"}


@pytest.mark.parametrize("name", FAST)
def test_fast_case_shows_its_truth_when_run_plainly(name):
    _check_plain(_case(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_case_shows_its_truth_when_run_plainly(name):
    _check_plain(_case(name))


def _check_plain(case: dict):
    run = judges.plain_run(case, timeout=600)
    raises = (case.get("plain") or {}).get("raises")
    if raises:
        assert run["rc"] != 0 and raises in run["stderr_tail"], run
        return
    assert run["rc"] == 0 and run["judge"] is not None, run["stderr_tail"]
    if case["kind"] == "planted":
        assert run["judge"]["defect"], run  # the planted defect really happens
    else:
        assert run["judge"]["finite"] and not run["judge"]["defect"], run  # clean code trains, finite


def test_migrate_harness_runs_one_file_end_to_end():
    entry = next(e for e in MIGRATE_FILES if e["file"] == "cifar_main.py")
    run = judges.run_migrate(entry, "musa", timeout=600)
    assert run["error"] is None and run["rc"] in (0, 1) and run["before"] != run["after"]
    assert all(isinstance(f.get("line"), int) for f in run["findings"])
    score = judges.score_migrate(entry["targets"]["musa"], ABSENT["musa"], run["before"], run["after"], run["findings"])
    judged = [r for r in entry["targets"]["musa"] if r["expect"] != "free"]
    assert len(score["rows"]) == len(judged) and {r["outcome"] for r in score["rows"]} <= {"right", "reported", "wrong", "missed"}


@pytest.mark.slow
def test_fast_subset_runs_and_reports_its_numbers(tmp_path, capsys):
    out = tmp_path / "judges.json"
    assert judges.main(["--fast", "--quiet", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["kind"] == "judges" and record["subset"] == "fast" and record["git_commit"] and record["versions"]["torch"]
    d, m = record["summary"]["diagnose"], record["summary"]["migrate"]
    assert d["harness_errors"] == 0 and {r["name"] for r in record["diagnose"]} == set(FAST)
    assert d["clean_cases"] + d["planted_defects"] == len(FAST)  # one defect per fast planted case
    assert d["right_line"] <= d["right_code"] and d["right_code"] + d["wrong_code"] + d["missed"] == d["planted_defects"]
    for target, counts in m.items():
        assert counts["harness_errors"] == 0, target
        assert counts["right"] + counts["reported"] + counts["wrong"] + counts["missed"] == counts["lines"]
    assert '"diagnose"' in capsys.readouterr().out  # the summary is printed


def test_benchmarks_page_shows_the_newest_full_run(tmp_path):
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "benchmarks" / "render_benchmarks.py")
    rb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    diagnose = {"clean_cases": 19, "clean_with_findings": 3, "false_findings": 4, "planted_defects": 11, "right_code": 7,
                "right_line": 5, "wrong_code": 2, "missed": 2, "extra_findings_on_planted": 1, "harness_errors": 0,
                "seconds": 600.0}
    cases = [{"name": "naive_softmax", "kind": "planted", "expect": [{"code": "nonfinite-forward", "line": 29}],
              "score": {"found": [{"code": "nonfinite-forward", "line": 30}]}}]
    migrate = {"musa": {"files": 12, "lines": 78, "right": 69, "reported": 2, "wrong": 2, "missed": 5,
                        "unexpected_changes": 1, "harness_errors": 0}}
    for name, subset, date in (("judges-2026-12-04.json", "full", "2026-12-04"), ("judges-fast.json", "fast", "2026-12-05")):
        record = {"kind": "judges", "subset": subset, "date": date, "git_commit": "0123456789abcdef",
                  "versions": {"torch": "2.13.0"}, "summary": {"diagnose": diagnose, "migrate": migrate},
                  "diagnose": cases, "migrate": []}
        (tmp_path / name).write_text(json.dumps(record))
    page = rb.render(rb.load_results(tmp_path))
    assert "judges-2026-12-04.json" in page and "judges-fast.json" not in page  # the full run, not the newer fast one
    assert "| 600 s | 19 | 3 | 4 | 11 | 7 | 5 | 2 | 2 | 1 |" in page
    assert "| naive_softmax | nonfinite-forward:29 | nonfinite-forward:30 |" in page
    assert "| musa | 12 | 78 | 69 | 2 | 2 | 5 | 1 |" in page


def test_held_out_cases_are_counted_apart_and_shown_apart(tmp_path):
    def result(name, kind, held, found):
        score = {"outcomes": ["right" if found else "missed"], "extra": 0, "found": []} if kind == "planted" else \
            {"false_findings": found, "found": []}
        return {"name": name, "kind": kind, "held_out": held, "expect": [], "error": None, "seconds": 1.0, "score": score}
    results = [result("a", "planted", False, 1), result("a_clean", "clean", False, 0),
               result("h", "planted", True, 0), result("h_clean", "clean", True, 2), result("h2_clean", "clean", True, 0)]
    s = judges.diagnose_summaries(results)
    assert (s["diagnose"]["planted_defects"], s["diagnose"]["right_line"], s["diagnose"]["clean_cases"]) == (1, 1, 1)
    held = s["diagnose_held_out"]
    assert (held["planted_defects"], held["missed"], held["clean_cases"], held["false_findings"]) == (1, 1, 2, 2)
    assert judges.diagnose_summaries(results[:2])["diagnose_held_out"] is None
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "benchmarks" / "render_benchmarks.py")
    rb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    record = {"kind": "judges", "subset": "full", "date": "2026-12-04", "git_commit": "0123456789abcdef",
              "versions": {"torch": "2.13.0"}, "summary": {**s, "migrate": None}, "diagnose": results, "migrate": []}
    (tmp_path / "judges-2026-12-04c.json").write_text(json.dumps(record))
    page = rb.render(rb.load_results(tmp_path))
    assert "| held out (judges-2026-12-04c.json), 3 s | 2 | 1 | 2 | 1 | 0 | 0 | 0 | 1 | 0 |" in page
    later = {**record, "date": "2026-12-05", "summary": {**s, "diagnose_held_out": None, "migrate": None}}
    (tmp_path / "judges-2026-12-05.json").write_text(json.dumps(later))
    page = rb.render(rb.load_results(tmp_path))  # the newer run has no held-out cases; the first scoring stays
    assert "| held out (judges-2026-12-04c.json), 3 s | 2 | 1 | 2 | 1 | 0 | 0 | 0 | 1 | 0 |" in page
    assert "| h_clean (held out) | nothing (clean) | nothing |" in page
