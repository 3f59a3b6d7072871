"""The main job's timing is stated once (benchmarks/cpu-compare-timing.json) and every page that gives
it says exactly that: a page with another figure fails here."""

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


def test_the_figure_was_measured():
    assert DATA["command"] == "ampkit compare" and DATA["exit_code"] == 0 and DATA["verdict"] == "pass"
    assert DATA["cpu_s"] > 0 and DATA["wall_s"] > 0 and DATA["machine"]["cores"] >= 1


@pytest.mark.parametrize("page", timing.PAGES)
def test_each_page_states_the_measured_figure(page):
    body = (ROOT / page).read_text(encoding="utf-8")
    stated = timing.MARK.findall(body)
    assert stated, f"{page} does not state the timing (between <!-- compare-timing --> markers)"
    assert all(s == timing.sentence(DATA) for s in stated), f"{page} states another figure: {stated}"


def test_no_page_states_an_unmeasured_timing():
    # the figures of earlier pages (12 s on a quiet 2-core CPU, one to two minutes, 24 s on an H200)
    stale = re.compile(r"\b12 s on a quiet|one to two minutes|24 s on an H200|two minutes on a busy|verdict in a minute")
    for page in (*timing.PAGES, "docs/index.md"):
        assert not stale.search((ROOT / page).read_text(encoding="utf-8")), page
