"""``ampkit bench`` on the CPU: the result object, the overhead ratio, the CPU notes, refusals."""

import json

import pytest

from ampkit.cli import main


@pytest.fixture(scope="module")
def digits_result():
    # One run shared by the checks below: the exact command of the issue, on the CPU.
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(["bench", "--model", "digits", "--steps", "5", "--json"])
    return code, buf.getvalue()


def test_digits_json_has_the_fields(digits_result):
    code, out = digits_result
    assert code == 0
    r = json.loads(out)  # stdout is the JSON and nothing else
    assert r["schema"] == 1
    assert set(r) >= {"date", "device", "versions", "model", "peak", "settings", "rows", "bars", "notes"}
    assert r["device"]["type"] == "cpu"
    assert r["peak"]["tflops"] > 0 and r["peak"]["dtype"] == "float32"
    assert r["model"]["name"] == "digits" and r["model"]["flops_per_step"] > 0
    assert r["settings"]["steps"] == 5
    precisions = {row["precision"] for row in r["rows"]}
    assert precisions == {"fp32", "bf16"}  # the CPU's defaults
    for row in r["rows"]:
        assert set(row) >= {"precision", "compiled", "runner", "status", "ms_per_step", "samples_per_s", "mfu",
                            "peak_mem_bytes", "ratio_to_plain", "host_syncs_per_step", "loss_last"}
        if row["runner"] in ("plain", "ampkit", "lesson"):
            assert row["status"] == "ok", row
            assert row["ms_per_step"] > 0 and row["samples_per_s"] > 0 and 0 < row["mfu"] < 1
            assert row["peak_mem_bytes"] is None and row["host_syncs_per_step"] is None  # no such counters on a CPU
        if row["runner"] in ("accelerate", "fabric"):
            assert row["status"] in ("ok", "refused", "unavailable"), row


def test_overhead_ratio_is_computed(digits_result):
    r = json.loads(digits_result[1])
    for prec in ("fp32", "bf16"):
        rows = {row["runner"]: row for row in r["rows"] if row["precision"] == prec}
        assert rows["plain"]["ratio_to_plain"] == pytest.approx(1.0)
        assert rows["ampkit"]["ratio_to_plain"] == pytest.approx(rows["ampkit"]["ms_per_step"] /
                                                                  rows["plain"]["ms_per_step"])
        bar = [b for b in r["bars"] if b["name"] == f"engine overhead {prec} eager"]
        assert len(bar) == 1 and bar[0]["value"] == pytest.approx(rows["ampkit"]["ratio_to_plain"])
        # the same weights, batches and step: the engine and the hand-written loop end at the same loss
        assert rows["ampkit"]["loss_last"] == pytest.approx(rows["plain"]["loss_last"], rel=1e-4)


def test_cpu_note_compares_autocast_with_fp32(digits_result):
    notes = json.loads(digits_result[1])["notes"]
    assert any(n.startswith("on the CPU autocast bf16 is") and "than fp32" in n for n in notes), notes


def test_gpt2_small_refused_on_cpu_in_one_line(capsys):
    assert main(["bench", "--model", "gpt2-small"]) == 2
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--model charlm" in lines[0] and "GPU" in lines[0]
    assert cap.out == ""


def test_bad_input_is_one_line(capsys):
    assert main(["bench", "--model", "lesson", "--precision", "fp4"]) == 2
    assert "unknown precision 'fp4'" in capsys.readouterr().err
    assert main(["bench", "--model", "lesson", "--precision", "fp8"]) == 1  # known, but this CPU has none
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no FP8 training" in err[0]
    assert main(["bench", "--model", "lesson", "--no-eager"]) == 2
    assert "--no-eager needs --compile" in capsys.readouterr().err
    assert main(["bench", "--model", "lesson", "--runners", "ampkit,deepspeed"]) == 2
    assert "unknown runner 'deepspeed'" in capsys.readouterr().err


def test_lesson_graph_runner_falls_back_on_cpu(capsys):
    assert main(["bench", "--model", "lesson", "--precision", "fp32", "--graph", "--runners",
                 "plain,ampkit,ampkit-graph,lesson", "--steps", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    g = next(row for row in r["rows"] if row["runner"] == "ampkit-graph")
    assert g["status"] == "ok" and g["graph_captured"] is False
    assert "cpu has no graph capture" in g["graph_fallback"]
    assert any("ran eagerly" in n for n in r["notes"])
    bar = next(b for b in r["bars"] if b["name"].startswith("whole-step graph"))
    assert bar["pass"] is False  # never a pass for a graph that was not captured


def test_human_table_renders(capsys):
    assert main(["bench", "--model", "lesson", "--precision", "fp32", "--runners", "plain,ampkit",
                 "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "fp32 eager" in out and "x plain" in out and "engine overhead fp32 eager" in out


def test_compiled_rows_use_the_compiled_loss(capsys):
    # backend="eager" exercises the compiled path (model + loss wrapped, recompiles per autocast state)
    # without paying for inductor on a 2-core CPU.
    from ampkit.bench import BenchConfig, run_bench

    r = run_bench(BenchConfig(model="lesson", precisions=("fp32", "bf16"), compile=True, compile_backend="eager",
                              runners=("plain", "ampkit", "lesson"), steps=2, warmup=1))
    compiled = [row for row in r["rows"] if row["compiled"]]
    assert {row["runner"] for row in compiled} == {"plain", "ampkit", "lesson"}
    assert all(row["status"] == "ok" for row in compiled), compiled
