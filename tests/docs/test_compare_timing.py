"""The main job's timing is stated once (benchmarks/cpu-compare-timing.json) and every page that gives
it says exactly that: a page with another figure fails here. Each figure is a recorded run with the load average
at its start and end and the seeds it used: the quiet machine's and the busy machine's (issue 45)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("cpu_compare_timing", ROOT / "benchmarks" / "cpu_compare_timing.py")
timing = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timing)

DATA = json.loads(timing.RESULT.read_text(encoding="utf-8"))


def test_the_figures_were_measured():
    assert set(DATA) <= {"quiet", "busy"} and DATA
    for kind, rec in DATA.items():
        assert rec["command"] == "ampkit compare" and rec["exit_code"] == 0 and rec["verdict"] == "pass"
        assert rec["cpu_s"] > 0 and rec["wall_s"] > 0 and rec["machine"]["cores"] >= 1
        assert rec["seeds_used"] >= 3 and rec["seeds_option"] in ("auto", "3")
        m = rec["machine"]
        assert (max(m["load_start"], m["load_end"]) < timing.QUIET_LOAD) == (kind == "quiet")


def _rec(load_start: float, load_end: float, **kw) -> dict:
    return {"command": "ampkit compare", "exit_code": 0, "verdict": "pass", "seeds_option": "auto", "seeds_used": 4,
            "cpu_s": 34.4, "wall_s": 74.2, "machine": {"cores": 2, "load_start": load_start, "load_end": load_end},
            "date": "2026-12-04", **kw}


def test_a_measurement_replaces_the_record_of_its_kind_and_says_its_load_and_seeds():
    quiet = _rec(0.4, 0.5, seeds_option="3", seeds_used=3, cpu_s=9.3, wall_s=6.8)
    data = timing.record(timing.record({}, quiet), _rec(5.2, 14.0))
    assert data["quiet"] is quiet and data["busy"]["machine"]["load_end"] == 14.0
    text = timing.sentence(data)
    assert text.startswith("9 s of CPU time and 7 s of wall time on a quiet 2-core CPU (load average 0.5) with 3 seeds")
    assert ("; 34 s and 74 s on the same CPU when busy (load average 5.2 at the start, 14.0 at the end) with the "
            "default --seeds auto (4 seeds), measured 2026-12-04") in text
    newer = timing.record(data, _rec(2.0, 3.0, cpu_s=20.0))
    assert newer["quiet"] is quiet and newer["busy"]["cpu_s"] == 20.0


@pytest.mark.parametrize("page", timing.PAGES)
def test_each_page_states_the_measured_figure(page):
    body = (ROOT / page).read_text(encoding="utf-8")
    stated = timing.MARK.findall(body)
    assert stated, f"{page} does not state the timing (between <!-- compare-timing --> markers)"
    assert all(s == timing.sentence(DATA) for s in stated), f"{page} states another figure: {stated}"


def test_no_page_states_an_unmeasured_timing():
    # the figures of earlier pages (12 s on a quiet 2-core CPU, one to two minutes, 24 s on an H200), and seeds
    # said beside the marker instead of in the recorded sentence
    stale = re.compile(r"\b12 s on a quiet|one to two minutes|24 s on an H200|two minutes on a busy|verdict in a minute"
                       r"|compare-timing --> with 3 seeds|With three seeds it takes")
    for page in (*timing.PAGES, "docs/index.md"):
        assert not stale.search((ROOT / page).read_text(encoding="utf-8")), page


def test_getting_started_states_the_recorded_threads_comparison():
    data = json.loads(timing.THREADS_RESULT.read_text(encoding="utf-8"))
    runs = data["runs"]
    # interleaved: torch's default count (OMP_NUM_THREADS set to it), then ampkit's default (the task's one thread)
    assert [r["omp_num_threads"] is None for r in runs] == [False, True] * (len(runs) // 2) and runs
    assert all(r["exit_code"] == 0 and r["verdict"] == "pass" and r["cpu_s"] > 0 for r in runs)
    stated = timing.THREADS_MARK.findall((ROOT / timing.THREADS_PAGE).read_text(encoding="utf-8"))
    assert stated == [timing.threads_sentence(data)]
