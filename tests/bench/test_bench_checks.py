"""``ampkit bench``: checked before the work (output file, compile mode, model size on the CPU), honest at the end
(nothing measured is an error), and Ctrl-C within seconds even inside one long torch call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ampkit.cli import main


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("target, needle", [
    ("/proc/no-such-dir/bench.json", "cannot be written"),
    ("{tmp}/missing/bench.json", "cannot be written"),
    ("{tmp}", "is a folder"),
])
def test_unwritable_out_is_refused_before_the_work(tmp_path, capsys, target, needle):
    t0 = time.perf_counter()
    assert main(["bench", "--model", "lesson", "--out", target.format(tmp=tmp_path)]) == 2
    assert needle in _one_line(capsys)
    assert time.perf_counter() - t0 < 5  # nothing was measured (a bench run takes far longer)


def test_writable_out_is_left_as_it_was_by_the_check(tmp_path):
    from ampkit.cli.common import check_writable

    check_writable(str(tmp_path / "new.json"), "--out")
    assert not (tmp_path / "new.json").exists()  # the probe file is removed again
    (tmp_path / "old.json").write_text("keep")
    check_writable(str(tmp_path / "old.json"), "--out")
    assert (tmp_path / "old.json").read_text() == "keep"


def test_bogus_compile_mode_is_one_line(capsys):
    assert main(["bench", "--model", "lesson", "--compile", "--compile-mode", "bogus"]) == 2
    line = _one_line(capsys)
    assert "'bogus' is not a torch.compile mode" in line and "max-autotune" in line
    assert main(["bench", "--model", "lesson", "--compile-mode", "default"]) == 2
    assert "add --compile" in _one_line(capsys)


def test_peers_only_compiled_is_refused_up_front(capsys):
    assert main(["bench", "--model", "lesson", "--runners", "accelerate", "--compile", "--no-eager"]) == 2
    assert "nothing to measure" in _one_line(capsys)


BROKEN_TASK = """
import torch
import ampkit

def make_task(seed=0):
    def loss(m, batch):
        raise RuntimeError("this loss cannot be computed")
    return ampkit.Task(name="broken", model=torch.nn.Linear(4, 1), batch=lambda step: (torch.randn(8, 4),), loss=loss)
"""


def test_nothing_measured_exits_non_zero(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken.py").write_text(BROKEN_TASK)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--model", "broken.py:make_task", "--runners", "plain,ampkit", "--precision", "fp32",
                 "--steps", "1", "--warmup", "0"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("ampkit bench: error: nothing was measured") and "cannot be computed" in last


@pytest.mark.parametrize("model", ["hf-gpt2", "resnet50"])
def test_gpu_sized_foreign_model_is_refused_on_the_cpu(capsys, model):
    pytest.importorskip("transformers" if model == "hf-gpt2" else "torchvision")
    assert main(["bench", "--model", model]) == 2
    line = _one_line(capsys)
    assert "sized for a GPU" in line and "--task-arg batch_size=" in line


SLOW_TASK = textwrap.dedent('''
    import sys
    import torch
    import ampkit

    def make_task(seed=0):
        torch.set_num_threads(1)
        model = torch.nn.Linear(4, 1)
        a = torch.randn(2000, 2000) / 2000 ** 0.5

        def loss(m, batch):
            print("LONG CALL", file=sys.stderr, flush=True)
            torch.linalg.matrix_power(a, 2 ** 62)  # one call into torch: 62 products of 2000^2, a minute or more
            return m(batch[0]).pow(2).mean()

        return ampkit.Task(name="slow", model=model, batch=lambda step: (torch.randn(8, 4),), loss=loss)
''')


@pytest.mark.slow  # 22 s on the busy 2-core machine
def test_ctrl_c_inside_one_long_torch_call_stops_within_seconds(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_TASK)
    proc = subprocess.Popen([sys.executable, "-m", "ampkit", "bench", "--model", "slow.py:make_task", "--runners",
                             "plain", "--precision", "fp32", "--steps", "1", "--warmup", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            # Ctrl-C as a terminal's foreground job gets it: a suite started in the background of a
                            # non-interactive shell (`cmd &`) hands its processes SIGINT ignored, and bench then
                            # never hears it (seen: exit 0 under `nohup bash -c "pytest -n 2" &`)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "LONG CALL" in line:
            break
    else:
        raise AssertionError("".join(seen))
    time.sleep(0.5)  # inside matrix_power now
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("bench ignored Ctrl-C for 30 s") from None
    assert proc.returncode == 130, f"exit {proc.returncode} after SIGINT; stderr: {err[-2000:]}"
    assert time.monotonic() - t0 < 15
    assert "stopped by SIGINT" in err and "Traceback" not in err  # the watcher's line: the call was still running
