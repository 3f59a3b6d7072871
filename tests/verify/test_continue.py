"""``compare --continue``: seeds already judged in --out are kept, not trained again, and never mixed with
runs of other settings."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

import ampkit
from ampkit.errors import UsageError
from ampkit.verify.prior import load_prior, run_record
from task_specs import TOY  # noqa: F401

TOY_SPEC = str(Path(__file__).resolve().parents[1] / "toy_task.py") + ":make_task"
JUDGED = ("verdict", "effects", "curves", "final_metric", "band", "skipped", "scale_trace", "seeds")


def _compare(out, seeds, **kw):
    kw.setdefault("precision", "bf16")
    kw.setdefault("steps", 12)
    return ampkit.compare(TOY_SPEC, seeds=seeds, log_every=3, device="cpu", run_audit=False, out=out,
                          graph=False, **kw)


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "compare.json").read_bytes()).hexdigest()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_continued_comparison_is_the_one_run_at_once(tmp_path, precision):
    _compare(tmp_path / "c", 2, precision=precision)
    events = []
    cont = _compare(tmp_path / "c", 3, precision=precision, resume=True, progress=events.append)
    fresh = _compare(tmp_path / "f", 3, precision=precision)
    started = [e["seed"] for e in events if e.get("event") == "run_start"]
    assert started == [2, 2]  # only the missing seed trained, in FP32 and in the AMP precision
    a, b = cont.to_dict(), fresh.to_dict()
    for key in JUDGED:
        assert a[key] == b[key], key
    assert any(n.startswith("continued: seeds 0, 1 loaded from") for n in cont.notes)
    on_disk = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert on_disk["seeds"] == [0, 1, 2] and set(on_disk["continuation"]["runs"]["amp"]) == {"0", "1", "2"}


@pytest.mark.parametrize("change, named", [
    ({"lr": 0.05}, "lr"),
    ({"task_options": {"hidden": 16}}, "task"),
    ({"precision": "fp16"}, "dtype"),
    ({"fp32_modules": "0"}, "fp32_modules"),
    ({"steps": 24}, "steps: 12 there, 24 now"),  # issue 47: 12- and 24-step runs are not one experiment
])
def test_other_settings_are_refused_and_the_folder_is_untouched(tmp_path, change, named):
    _compare(tmp_path / "c", 2)
    before = _digest(tmp_path / "c")
    with pytest.raises(UsageError, match=rf"other settings \({named}"):
        _compare(tmp_path / "c", 3, resume=True, **change)
    assert _digest(tmp_path / "c") == before


def test_fewer_seeds_no_folder_and_old_files_are_one_line(tmp_path):
    _compare(tmp_path / "c", 3)
    with pytest.raises(UsageError, match="already holds seeds 0-2; give --seeds 3 or more"):
        _compare(tmp_path / "c", 2, resume=True)
    with pytest.raises(UsageError, match="does not exist: run without --continue first"):
        _compare(tmp_path / "none", 2, resume=True)
    path = tmp_path / "c" / "compare.json"
    data = json.loads(path.read_text())
    del data["continuation"]
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="holds no runs that can be continued"):
        _compare(tmp_path / "c", 4, resume=True)
    with pytest.raises(UsageError, match="give --out"):
        ampkit.compare(TOY_SPEC, seeds=2, steps=4, device="cpu", precision="bf16", resume=True)


def test_a_non_finite_run_survives_the_round_trip(tmp_path):
    result = _compare(tmp_path / "c", 2)
    runs = load_prior(tmp_path / "c", result.continuation["settings"])
    run = runs["amp"][1]
    run.final, run.result.history[-1]["loss"] = math.nan, math.inf
    rec = json.loads(json.dumps(run_record(run), allow_nan=False))  # strict JSON, as compare.json is
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    data["continuation"]["runs"]["amp"]["1"] = rec
    (tmp_path / "c" / "compare.json").write_text(json.dumps(data))
    again = load_prior(tmp_path / "c", result.continuation["settings"])
    assert math.isnan(again["amp"][1].final) and again["amp"][1].result.history[-1]["loss"] == math.inf
    cont = _compare(tmp_path / "c", 2, resume=True)
    assert cont.verdict == "fail" and any("not finite" in r or "non-finite" in r for r in cont.reasons)


def test_cli_continue(tmp_path, capsys):
    """The CLI's --continue, in this process (ampkit's main; a subprocess per run cost ~3 s of start-up each)."""
    from ampkit.cli import main

    out = tmp_path / "c"
    base = ["compare", "--task", TOY_SPEC, "--precision", "bf16", "--steps", "8", "--device", "cpu", "--no-audit",
            "--no-graph", "--out", str(out)]
    assert main(base + ["--seeds", "2"]) in (0, 3)
    capsys.readouterr()
    code = main(base + ["--seeds", "3", "--continue"])
    done = capsys.readouterr()
    assert code in (0, 3), done.err
    assert "continued: seeds 0, 1 loaded from" in done.out + done.err
    code = main(base + ["--seeds", "4", "--continue", "--lr", "0.5"])
    bad = capsys.readouterr()
    assert code == 2 and "Traceback" not in bad.err and "other settings (lr" in bad.err
    code = main(base[:1] + ["--continue", str(tmp_path / "x.py")])
    assert code == 2 and "--continue is for tasks" in capsys.readouterr().err


def test_an_inconclusive_summary_gives_the_continue_command(tmp_path, capsys):
    from dataclasses import replace

    from ampkit.cli.compare import _summary

    result = _compare(tmp_path / "c", 2)
    effects = {**result.effects, "endpoints": [{**e, "seeds_to_decide": 7} for e in result.effects["endpoints"]]}
    capsys.readouterr()
    _summary(replace(result, verdict="inconclusive", effects=effects))
    assert "--seeds 7 --continue trains only the 5 missing seeds" in capsys.readouterr().out
    _summary(replace(result, verdict="inconclusive", effects=effects, continuation=None))  # compare SCRIPT
    assert "--continue" not in capsys.readouterr().out


def _record(precision):
    return {"precision": precision, "metric": "accuracy", "final": 0.9, "wall_s": 1.0, "steps": 4, "skipped": 0,
            "final_loss": 0.5, "history": [{"step": 4, "loss": 0.5}], "samples_per_s": 10.0, "peak_mem_bytes": None,
            "warnings": [], "step_graph": False, "step_graph_fallback": None}


def test_recorded_runs_of_other_seeds_per_side_are_refused(tmp_path):
    """A compare.json whose FP32 and AMP runs are not of the same seeds is never judged as pairs."""
    data = {"task": "toy", "continuation": {"schema": 1, "settings": {"steps": 4}, "runs": {
        "fp32": {"0": _record("fp32"), "1": _record("fp32")}, "amp": {"0": _record("bf16")}}}}
    (tmp_path / "compare.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match="not of the same seeds"):
        load_prior(tmp_path, {"steps": 4})
    data["continuation"]["runs"]["amp"]["1"] = _record("bf16")
    (tmp_path / "compare.json").write_text(json.dumps(data))
    runs = load_prior(tmp_path, {"steps": 4})
    assert set(runs["amp"]) == {0, 1} and runs["amp"][1].final == 0.9
