"""ampkit.distributed without starting processes: backend choice and refusals, data shares, the
--nproc command line, metrics truncation, sharded-checkpoint bookkeeping and a one-process dcp resume."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from _runs import TASK_OPTIONS, ampkit  # noqa: E402

from ampkit import distributed as D  # noqa: E402
from ampkit.checkpoint.dcp import RunCheckpoints  # noqa: E402
from ampkit.cli import build_parser  # noqa: E402
from ampkit.cli.train import _train_argv  # noqa: E402
from ampkit.device import Device  # noqa: E402
from ampkit.errors import DeviceError, UsageError  # noqa: E402
from ampkit.device.policy import resolve_precision  # noqa: E402
from ampkit.training.trainer import TrainConfig, train  # noqa: E402
from ampkit.training.metrics import truncate_metrics  # noqa: E402


def test_backend_comes_from_the_device_layer():
    assert Device("cpu").collective_backend == "gloo"
    assert Device("cuda", 0).collective_backend == "nccl"
    assert Device("musa", 0).collective_backend == "mccl"


@pytest.mark.parametrize("card", ["MTT S80", "MTT S3000"])
def test_no_mccl_card_is_refused_with_its_name(simulated_musa, monkeypatch, card):
    simulated_musa(card)
    with pytest.raises(DeviceError, match=f"{card} has no mccl"):
        D.check_collectives(Device("musa", 0))
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DeviceError, match="not supported on this card"):
        D.init_from_env(Device("musa", 0))  # refused before any process group is made
    assert not torch.distributed.is_initialized()


def test_card_with_mccl_passes(simulated_musa):
    simulated_musa("MTT S4000")
    D.check_collectives(Device("musa", 0))


def test_each_local_rank_needs_its_own_device(simulated_musa, monkeypatch):
    simulated_musa("MTT S4000")  # one card
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DeviceError, match="local rank 1 has no musa device: this node has 1"):
        D.init_from_env(Device("musa", 0))


def test_not_launched_means_no_context(monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert not D.launched() and D.init_from_env(Device("cpu")) is None


def test_shard_batch_splits_the_global_batch():
    x, y = torch.arange(12).reshape(6, 2), torch.arange(6)
    parts = [D.shard_batch((x, y), r, 3) for r in range(3)]
    assert sorted(torch.cat([p[1] for p in parts]).tolist()) == y.tolist()
    assert all(p[0].shape == (2, 2) for p in parts)
    with pytest.raises(UsageError, match="multiple of 4"):
        D.shard_batch((x, y), 0, 4)


def test_mp_policy_per_precision():
    cpu = Device("cpu")
    bf16 = D.mp_policy(resolve_precision("bf16", cpu))
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    fp32 = D.mp_policy(resolve_precision("fp32", cpu))
    assert fp32.param_dtype is None and fp32.reduce_dtype == torch.float32


def test_nproc_command_line_round_trips():
    argv = ["train", "--task", "charlm", "--task-arg", "d_model=32", "--task-arg", "n_layers=2", "--nproc", "2",
            "--max-restarts", "1", "--strategy", "fsdp", "--precision", "bf16", "--resume", "--out", "runs/x",
            "--max-grad-norm", "0.5", "--steps", "7", "--callback", "a.py:make", "--callback", "b:make",
            "--stop-signal", "SIGUSR1", "--init-scale", "1024", "--fp32-modules", "preset:norm"]
    args = build_parser().parse_args(argv)
    inner = _train_argv(args._parser, args)
    assert "--nproc" not in inner and "--max-restarts" not in inner
    again = build_parser().parse_args(["train", *inner])
    for key, value in vars(args).items():
        if key not in ("nproc", "max_restarts", "_parser", "func"):
            assert getattr(again, key) == value, key
    cmd = D.torchrun_argv(2, inner, max_restarts=1)
    assert cmd[1:9] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                        "-m"]
    assert cmd[9:11] == ["ampkit", "train"]
    # torchrun forwards the stop signal to the ranks only when told to catch it
    with_usr1 = D.torchrun_argv(2, inner, stop_signal="SIGUSR1")
    assert with_usr1[with_usr1.index("--signals-to-handle") + 1] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert "--signals-to-handle" not in D.torchrun_argv(2, inner, stop_signal="SIGTERM")


def test_max_restarts_needs_nproc():
    p = ampkit(["train", "--task", "digits", "--max-restarts", "1"])
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--max-restarts goes with --nproc" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_truncate_metrics_drops_steps_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 9)) + '{"step": 9, "lo')
    assert truncate_metrics(path, 6) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert truncate_metrics(path, 6) == 0


def test_incomplete_sharded_checkpoints_are_not_listed(tmp_path):
    folder = tmp_path / "checkpoints"
    good, torn, tmp = folder / "step-00000004.dcp", folder / "step-00000008.dcp", folder / ".step-00000012.dcp.tmp"
    for d in (good, torn, tmp):
        d.mkdir(parents=True)
        (d / ".metadata").write_bytes(b"x")
    (good / "ampkit.pt").write_bytes(b"x")
    (tmp / "ampkit.pt").write_bytes(b"x")
    ck = RunCheckpoints(folder, sharded=True)
    assert ck.list() == [(4, good)]
    assert [p for _, p in ck.candidates()] == [good]


def test_sharded_format_in_one_process_resumes_bit_exact(tmp_path):
    """``--strategy fsdp`` without torchrun: one process, dcp checkpoints without a process group."""
    common = dict(task="charlm", task_options=TASK_OPTIONS, precision="fp32", log_every=1, evaluate=False)
    full = train(TrainConfig(**common, steps=6))
    out = tmp_path / "run"
    train(TrainConfig(**common, steps=3, out=str(out), ckpt_every=3, strategy="fsdp"))
    assert (out / "checkpoints" / "step-00000003.dcp" / "ampkit.pt").is_file()
    (out / "checkpoints" / ".step-00000009.dcp.tmp").mkdir()  # a save killed midway: ignored
    # --resume finds the .dcp folder without --strategy being repeated
    resumed = train(TrainConfig(**common, steps=6, out=str(out), resume=True))
    assert resumed.start_step == 3 and resumed.resumed_from.endswith("step-00000003.dcp")
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history[3:]]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))


def test_user_shard_hook_decides_what_is_sharded(tmp_path):
    """A one-process gloo group (world size 1) is enough for fully_shard to run for real."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    cpu = Device("cpu")
    fp32 = resolve_precision("fp32", cpu)
    assert D.wrap_model(model, "fsdp", fp32, cpu) is model  # no process group: left alone
    with pytest.raises(UsageError, match="unknown strategy"):
        D.wrap_model(model, "zero3", fp32, cpu)
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        calls = []

        def hook(m, shard):
            calls.append(m)
            shard(m[0])

        D.wrap_model(model, "fsdp", fp32, cpu, shard_fn=hook)
        assert calls == [model]
        kinds = [type(m).__name__ for m in (model, model[0], model[2])]
        assert kinds[0].startswith("FSDP") and kinds[1].startswith("FSDP") and kinds[2] == "Linear"
    finally:
        torch.distributed.destroy_process_group()


def test_engine_no_sync_covers_fsdp2_accumulation():
    """FSDP2 modules have set_requires_gradient_sync instead of DDP's no_sync."""
    from ampkit.engine import MixedPrecision

    class Sharded(torch.nn.Linear):
        def __init__(self):
            super().__init__(2, 2)
            self.calls = []

        def set_requires_gradient_sync(self, flag):
            self.calls.append(flag)

    model = Sharded()
    amp = MixedPrecision(resolve_precision("fp32", Device("cpu")), accumulation_steps=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for micro in range(2):
        with amp.no_sync(model):
            amp.backward(model(torch.ones(1, 2)).sum())
        amp.step(opt)
    assert model.calls == [False, True]  # off for the first micro-step, restored; untouched on the last


def test_a_signal_hidden_behind_torchruns_own_error_still_gives_128_plus_n(monkeypatch):
    # torch's elastic agent can raise UnboundLocalError from its metrics wrapper while handling the
    # SignalException of a SIGTERM (seen in CI): the launcher must still exit 143, not print a traceback.
    import signal

    import torch.distributed.run as trun
    from torch.distributed.elastic.multiprocessing import SignalException

    from ampkit.distributed.launch import run_torchrun

    def fake_run(_args):
        try:
            raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
        except SignalException:
            raise UnboundLocalError("cannot access local variable 'start'")

    monkeypatch.setattr(trun, "run", fake_run)
    monkeypatch.setattr(trun, "parse_args", lambda args: args)
    assert run_torchrun(["--standalone"]) == 143

    def other_error(_args):
        raise UnboundLocalError("a real bug")

    monkeypatch.setattr(trun, "run", other_error)
    with pytest.raises(UnboundLocalError):
        run_torchrun(["--standalone"])
