"""Multi-process runs of `compare SCRIPT` (ampkit.diagnose.script_launch), fast: the launch command lines, the
merge of the ranks' records, a rank's own record, and stopping the launcher's whole process group. The real
torchrun / accelerate launch comparisons (slow) are in tests/verify/test_script_reach.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.diagnose.script_launch import (Launch, is_launcher, launch_process, launcher_tail, merge_ranks,
                                          parse_launch)
from ampkit.errors import UsageError

PLAIN = str(Path(__file__).parent.parent / "verify" / "scripts" / "plain_loop.py")


def test_parse_torchrun_and_accelerate_command_lines():
    launch, script, args = parse_launch(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"])
    assert (launch.kind, launch.nproc, script, args) == ("torchrun", 2, "train.py", ["--lr", "0.1"])
    assert launch.options == ("--standalone", "--nproc-per-node", "2")  # a free port of its own
    assert launch.argv("E", "S.json")[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                              "2", "-m", "E", "S.json"]
    launch, script, _ = parse_launch(["python", "-m", "torch.distributed.run", "--nproc_per_node=4",
                                      "--master-port", "29600", "t.py"])
    assert launch.nproc == 4 and launch.options == ("--nproc_per_node=4", "--master-port", "29600") and script == "t.py"
    launch, script, args = parse_launch(["accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                                         "--mixed_precision", "bf16", "--downcast_bf16", "t.py", "x"])
    assert (launch.kind, launch.nproc, script, args) == ("accelerate", 2, "t.py", ["x"])
    assert launch.argv("E", "S")[1:3] == ["-m", "accelerate.commands.launch"]
    assert launch.describe() == "accelerate launch --multi_gpu --num_processes 2 --mixed_precision bf16 --downcast_bf16"
    assert Launch.torchrun(3).describe() == "torchrun --standalone --nproc-per-node 3"
    assert is_launcher("torchrun") and is_launcher("accelerate", ["launch"]) and not is_launcher("train.py")
    assert is_launcher("python3", ["-m", "torch.distributed.run"]) and not is_launcher("python", ["x.py"])


@pytest.mark.parametrize("words,expect", [
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], "this machine only, not on 2 nodes"),
    (["torchrun", "-m", "pkg.train"], "give the script's path"),
    (["torchrun", "--nproc-per-node", "2"], "no script after `torchrun`"),
])
def test_launches_compare_cannot_run_are_one_line(words, expect):
    with pytest.raises(UsageError, match=expect):
        parse_launch(words)


def _rec(rank, losses, skipped=None, **kw):
    n = len(losses)
    return {"rank": rank, "world": 2, "steps": n, "losses": losses, "skipped": skipped or [None] * n,
            "scales": [None] * n, "autocast": ["cpu:bfloat16"], "scaler_enabled": False, "cpu_s": 1.0,
            "refusal": None, "error": None, "stopped": "finished", **kw}


def test_merge_takes_the_mean_over_ranks():
    merged = merge_ranks([_rec(0, [1.0, 2.0]), _rec(1, [3.0, 6.0])], what="run")
    assert merged["losses"] == [2.0, 4.0] and merged["ranks"] == 2 and merged["cpu_s"] == 2.0


@pytest.mark.parametrize("recs,expect", [
    ([_rec(0, [1.0, 2.0]), _rec(1, [1.0])],
     r"the ranks disagree on the optimizer steps \(rank 0 took 2, rank 1 took 1\)"),
    ([_rec(0, [1.0], [1.0]), _rec(1, [1.0], [0.0])],
     "disagree on skipping optimizer step 1 .rank 0 skipped, rank 1 stepped"),
    ([_rec(0, [1.0])], r"rank 1 of 2 died without a record \(launcher exit 1; boom\); no verdict"),
    ([_rec(0, [], error="RuntimeError: Connection closed by peer")],
     r"rank 1 of 2 died without a record \(launcher exit 1; boom\); then rank 0: RuntimeError: Connection closed"),
    ([], "without a record from any rank"),
])
def test_ranks_that_disagree_or_die_end_the_comparison(recs, expect):
    with pytest.raises(UsageError, match=expect):
        merge_ranks(recs, what="run", code=1, tail="boom")


def test_launcher_tail_is_torchrun_root_cause():
    text = "Failures:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15\n" \
           "Root Cause (first observed failure):\n[0]:\n" \
           "  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 4287)\n=====\n"
    assert launcher_tail(text) == "root cause: rank 1 exit code 3"
    assert launcher_tail("x\nValueError: no\n\n") == "ValueError: no"


def test_a_ranks_own_error_names_the_rank():
    merged = merge_ranks([_rec(0, [1.0]), _rec(1, [], error="ValueError: bad shard", stopped="crashed")], what="run")
    assert merged["error"] == "rank 1: ValueError: bad shard"


def test_each_rank_writes_its_own_record(tmp_path):
    """The child under a launcher (RANK / WORLD_SIZE set): run-rank{R}.json, with its rank and world."""
    spec = {"script": PLAIN, "args": ["--epochs", "1"], "mode": "fp32", "seed": 0, "steps": 2, "dtype": None,
            "audit": False, "out": str(tmp_path / "run.json"), "launched": True}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    subprocess.run([sys.executable, "-m", "ampkit.diagnose.script_run", str(tmp_path / "spec.json")], env=env,
                   check=True, capture_output=True)
    rec = json.loads((tmp_path / "run-rank1.json").read_text())
    assert not (tmp_path / "run.json").exists() and (rec["rank"], rec["world"], rec["steps"]) == (1, 2, 2)


def test_stopping_a_launch_stops_its_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    argv = ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    with pytest.raises(subprocess.TimeoutExpired):
        launch_process(argv, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout_s=2)
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the launcher's child {child} outlived the stop")


def test_cli_nproc_is_for_scripts_and_one_launch(capsys):
    assert main(["compare", "--nproc", "2"]) == 2
    assert "--nproc launches a SCRIPT" in capsys.readouterr().err
    assert main(["compare", "--nproc", "2", "--", "torchrun", "--nproc-per-node", "2", PLAIN]) == 2
    assert "give one of them" in capsys.readouterr().err
