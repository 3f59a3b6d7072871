"""BENCHMARKS.md is what benchmarks/render_benchmarks.py makes of benchmarks/results/*.json, and the
README's measured figures are the ones in those files."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from docs_examples import ROOT

SCRIPT = ROOT / "benchmarks" / "render_benchmarks.py"


def _render_module():
    spec = importlib.util.spec_from_file_location("render_benchmarks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_is_up_to_date():
    rb = _render_module()
    assert (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") == rb.render(), (
        "BENCHMARKS.md is out of date: run `python benchmarks/render_benchmarks.py`")


def test_check_command_fails_on_a_stale_file(tmp_path, monkeypatch):
    rb = _render_module()
    stale = tmp_path / "BENCHMARKS.md"
    stale.write_text(rb.render().replace("**PASS**", "**FAIL**", 1), encoding="utf-8")
    monkeypatch.setattr(rb, "OUTPUT", stale)
    assert rb.main(["--check"]) == 1
    stale.write_text(rb.render(), encoding="utf-8")
    assert rb.main(["--check"]) == 0


def test_every_result_file_records_its_commit():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert json.loads(path.read_text(encoding="utf-8")).get("git_commit"), path.name


def test_a_file_without_commit_is_refused_and_stamp_adds_it(tmp_path):
    rb = _render_module()
    src = ROOT / "benchmarks" / "results" / "h200-doctor.json"
    data = json.loads(src.read_text(encoding="utf-8"))
    del data["git_commit"]
    path = tmp_path / "new.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    with pytest.raises(rb.ResultError, match="no git_commit.*--stamp"):
        rb.load_results(tmp_path)
    assert rb.stamp(path, "0123456789abcdef0123") is True
    assert rb.stamp(path, "something else") is False          # never overwritten
    loaded = rb.load_results(tmp_path)
    assert loaded[0]["git_commit"] == "0123456789abcdef0123"
    assert {k: v for k, v in loaded[0].items() if not k.startswith("_") and k != "git_commit"} == data


def test_newest_file_wins_per_row(tmp_path):
    rb = _render_module()
    base = json.loads((ROOT / "benchmarks" / "results" / "h200-lesson-graph.json").read_text(encoding="utf-8"))
    newer = json.loads(json.dumps(base))
    newer["date"] = "2099-01-01T00:00:00+00:00"
    newer["git_commit"] = "feedfacefeedface"
    newer["rows"] = [r for r in newer["rows"] if r["runner"] == "plain" and r["precision"] == "fp16"]
    newer["rows"][0]["ms_per_step"] = 1.234
    for name, d in (("old.json", base), ("new.json", newer)):
        (tmp_path / name).write_text(json.dumps(d), encoding="utf-8")
    page = rb.render(rb.load_results(tmp_path))
    plain_fp16 = next(line for line in page.splitlines() if line.startswith("| fp16 | eager | hand-written loop |"))
    assert "| 1.23 |" in plain_fp16
    assert "`feedfacefeed`" in page and "2099-01-01" in page
    assert "| bf16 | eager | hand-written loop | 1.43 |" in page  # still from the older file


def test_script_runs_from_the_command_line():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_readme_figures_come_from_the_results():
    # The README's comparison table quotes run 2's GPT-2-small file (the one run with every peer).
    data = json.loads((ROOT / "benchmarks" / "results" / "h200-gpt2-small-amp.json").read_text(encoding="utf-8"))
    rows = {r["runner"]: r for r in data["rows"] if r["precision"] == "bf16" and not r["compiled"]}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = next(line for line in readme.splitlines() if line.startswith("| time vs the hand-written loop"))
    assert f"({rows['plain']['ms_per_step']:.2f} ms)" in table
    assert f"({rows['ampkit']['ms_per_step']:.2f} ms)" in table
    for runner in ("lesson", "accelerate", "fabric", "ampkit"):
        assert f"{rows[runner]['ratio_to_plain']:.3f}" in table, runner
    memory = next(line for line in readme.splitlines() if line.startswith("| peak memory"))
    for runner in ("plain", "accelerate", "fabric", "ampkit"):
        assert f"{rows[runner]['peak_mem_bytes'] / 2**30:.2f} GiB" in memory, runner
    syncs = next(line for line in readme.splitlines() if line.startswith("| host syncs per step"))
    shown = [c.replace("*", "").strip().split(" ")[0] for c in syncs.split("|")[2:-1]]
    expected = [f"{rows[r]['host_syncs_per_step']:g}" for r in ("plain", "lesson", "accelerate", "fabric", "ampkit")]
    assert shown == expected


def test_unknown_kind_is_refused_and_bench_commit_is_read_from_versions(tmp_path):
    rb = _render_module()
    (tmp_path / "odd.json").write_text(json.dumps({"git_commit": "abc", "figures": [1, 2]}), encoding="utf-8")
    with pytest.raises(rb.ResultError, match="odd.json: unknown kind of result"):
        rb.load_results(tmp_path)
    (tmp_path / "odd.json").unlink()
    bench = json.loads((ROOT / "benchmarks" / "results" / "h200-digits-graph.json").read_text(encoding="utf-8"))
    del bench["git_commit"]
    bench["versions"]["git_commit"] = "0123456789abcdef"   # where `ampkit bench --json` records it
    (tmp_path / "b.json").write_text(json.dumps(bench), encoding="utf-8")
    assert "`0123456789ab`" in rb.render(rb.load_results(tmp_path))


def test_rounds_files_show_every_round(tmp_path):
    rb = _render_module()
    page = rb.render(rb.load_results(ROOT / "benchmarks" / "results"))
    fp8 = json.loads((ROOT / "benchmarks" / "results" / "h200-2026-12-01-fp8.json").read_text(encoding="utf-8"))
    for r in fp8["results"]:
        assert rb._ms(r["ms_per_step"]) in page
    assert f"## {fp8['benchmark']}" in page


def test_sizes_files_show_every_configuration_and_compare_rows_keep_each_model(tmp_path):
    rb = _render_module()
    page = rb.render(rb.load_results(ROOT / "benchmarks" / "results"))
    sizes = json.loads((ROOT / "benchmarks" / "results" / "h200-2026-12-01-digits-sizes.json").read_text(encoding="utf-8"))
    section = page.split("## The main job at several model sizes", 1)[1].split("\n## ", 1)[0]
    for row in sizes["configs"].values():
        line = next(x for x in section.splitlines() if x.startswith(f"| `{row['command']}` |"))
        assert f"**{row['verdict'].upper()}**" in line
        assert rb._ratio(row["speedup_eager"] if row["step_graph"] else row["speedup"], 2) in line
    compare = page.split("## FP32 vs AMP", 1)[1].split("\n## ", 1)[0]
    digits_bf16 = [x for x in compare.splitlines() if x.startswith("| digits |") and "| bf16 |" in x]
    assert len(digits_bf16) == 2 and any("large CNN" in x for x in digits_bf16)  # a new size does not hide the old
