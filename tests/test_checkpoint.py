import os
import subprocess
import sys
import textwrap

import pickle

import numpy as np
import pytest
import torch
from torch import nn

import ampkit
from ampkit.checkpoint import CheckpointManager, load_checkpoint, save_checkpoint
from ampkit.errors import CheckpointError, UsageError


def _parts():
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    return model, opt


def test_roundtrip_weights_only(tmp_path):
    model, opt = _parts()
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=5)
    state = load_checkpoint(p)
    assert state["step"] == 5 and set(state["rng"]) >= {"python", "torch", "numpy"}
    # Nothing but temp-free final files in the folder.
    assert [f.name for f in tmp_path.iterdir()] == ["a.pt"]


def test_malicious_checkpoint_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    path = tmp_path / "step-00000001.pt"
    torch.save({"format": "ampkit-checkpoint", "model": Evil()}, path)
    with pytest.raises(CheckpointError, match="pickled code"):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_truncated_newest_falls_back(tmp_path):
    model, opt = _parts()
    mgr = CheckpointManager(tmp_path, keep=5)
    mgr.save(step=1, model=model, optimizer=opt)
    p2 = mgr.save(step=2, model=model, optimizer=opt)
    p2.write_bytes(p2.read_bytes()[:100])
    found = mgr.latest()
    assert found.state["step"] == 1
    assert found.skipped and found.skipped[0][0] == p2 and "corrupt or truncated" in found.skipped[0][1]
    assert len(found.skipped[0][1].splitlines()) == 1


def test_keep_last_k(tmp_path):
    model, opt = _parts()
    mgr = CheckpointManager(tmp_path, keep=2)
    for s in range(1, 5):
        mgr.save(step=s, model=model, optimizer=opt)
    assert [s for s, _ in mgr.list()] == [3, 4]


def test_crash_during_write_keeps_previous(tmp_path, monkeypatch):
    model, opt = _parts()
    mgr = CheckpointManager(tmp_path, keep=5)
    mgr.save(step=1, model=model, optimizer=opt)
    real_save = torch.save

    def dying_save(obj, fh, *a, **k):
        fh.write(b"partial bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(CheckpointError, match="No space left"):
        mgr.save(step=2, model=model, optimizer=opt)
    monkeypatch.setattr(torch, "save", real_save)
    assert [s for s, _ in mgr.list()] == [1]
    assert sorted(os.listdir(tmp_path)) == ["last-good.json", "step-00000001.pt"]  # no temp file left behind
    assert mgr.latest().state["step"] == 1


def test_kill_9_leaves_loadable_checkpoint(tmp_path):
    """A process that saves in a tight loop is SIGKILLed; the newest file still loads."""
    script = textwrap.dedent(f"""
        import torch, sys
        from torch import nn
        from ampkit.checkpoint import CheckpointManager
        model = nn.Linear(256, 256); opt = torch.optim.AdamW(model.parameters())
        mgr = CheckpointManager({str(tmp_path)!r}, keep=2)
        s = 0
        while True:
            s += 1
            mgr.save(step=s, model=model, optimizer=opt)
            if s == 3:
                print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    found = CheckpointManager(tmp_path).latest()
    assert found.state is not None and found.state["step"] >= 3
    assert not found.skipped


def test_rng_state_restores_from_a_device_mapped_checkpoint(tmp_path):
    """torch.set_rng_state takes CPU byte tensors; a checkpoint mapped to a device carries them there.
    On the CPU we can only check the round trip; tests/distributed/test_torchrun_gpu.py resumes on CUDA."""
    from ampkit.checkpoint import rng_state, set_rng_state

    state = rng_state()
    a = torch.rand(3)
    set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


# ---------------------------------------------------------------------------- durability (issue 12, item 4)
def test_file_and_folder_fsynced_before_and_after_the_rename(tmp_path, monkeypatch):
    """The temp file is complete and fsynced before os.replace; the folder is fsynced after it."""
    import stat

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file", name, st.st_size))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    model, opt = _parts()
    final = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1)
    kinds = [e[0] for e in events]
    assert kinds == ["fsync-file", "replace", "fsync-dir"], events
    _, synced, size = events[0]
    assert events[1][1] == synced and events[1][2] == str(final)  # the file fsynced is the one renamed
    assert size == final.stat().st_size  # fsynced after everything was written and flushed
    assert events[2][1] == str(tmp_path)


# ---------------------------------------------------------------------------- save refuses what load refuses
class _Obj:
    pass


def _loadable_cases():
    import collections

    return {
        "object": object(), "instance": _Obj(), "function": len, "class": int, "numpy array": np.zeros(2),
        "numpy scalar": np.float64(1.0), "frozenset": frozenset({1}), "defaultdict": collections.defaultdict(int),
        "slice": slice(1, 2), "range": range(3), "path": __import__("pathlib").Path("x"),
        "generator": torch.Generator(), "set": {1, 2}, "complex": 1 + 2j, "bytes": b"x", "Size": torch.Size([2]),
        "dtype": torch.float16, "device": torch.device("cpu"), "OrderedDict": collections.OrderedDict(a=1),
        "Counter": collections.Counter(a=1), "Parameter": nn.Parameter(torch.zeros(2)), "int key": {1: 2},
        "tuple key": {(1, 2): 3}, "tensor key": {torch.zeros(1): 1}, "object key": {_Obj(): 1},
        "big int": 2**100, "nan": float("nan"), "bf16 tensor": torch.zeros(2, dtype=torch.bfloat16),
        "sparse": torch.zeros(2, 2).to_sparse(), "layout": torch.strided, "nested": {"a": [1, (2, {"b": _Obj()})]},
    }


@pytest.mark.parametrize("name", sorted(_loadable_cases()))
def test_save_time_check_agrees_with_weights_only_load(name, tmp_path):
    """check_loadable refuses a value exactly when torch.load(weights_only=True) refuses it."""
    import io

    from ampkit.checkpoint import check_loadable

    value = _loadable_cases()[name]
    buf = io.BytesIO()
    torch.save({"v": value}, buf)
    buf.seek(0)
    try:
        torch.load(buf, weights_only=True)
        loads = True
    except pickle.UnpicklingError:
        loads = False
    try:
        check_loadable({"v": value}, "extra")
        saves = True
    except CheckpointError as exc:
        assert len(str(exc).splitlines()) == 1 and "weights_only=True" in str(exc)
        saves = False
    assert saves == loads


def test_save_refuses_an_unloadable_extra_naming_the_key(tmp_path):
    model, opt = _parts()
    with pytest.raises(CheckpointError, match=r'^extra\["obj"\]: object is not loadable with weights_only=True'):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1, extra={"obj": object()})
    with pytest.raises(CheckpointError, match=r'^extra\["data"\]\[1\]\["pos"\]: numpy.ndarray is not loadable'):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1,
                        extra={"data": [0, {"pos": np.arange(3)}]})
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_save_refuses_a_scheduler_that_does_not_load(tmp_path):
    """A scheduler whose state holds an object (a callable class as lr_lambda) fails at save, not at resume."""
    class Warmup:  # a callable object: LambdaLR saves its __dict__, here with an unloadable value
        def __init__(self):
            self.fn = _Obj()

        def __call__(self, step):
            return 1.0

    model, opt = _parts()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Warmup())
    with pytest.raises(CheckpointError, match=r'^scheduler\["lr_lambdas"\]\[0\]\["fn"\]: .*_Obj is not loadable'):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, scheduler=sched, step=1)


# ---------------------------------------------------------------------------- files that are not ampkit's
def test_plain_torch_checkpoint_is_explained_and_restorable(tmp_path):
    model, opt = _parts()
    p = tmp_path / "plain.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7}, p)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(p)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1
    assert "plain torch checkpoint (a dict with keys 'model', 'optimizer', 'step'), not" in msg
    torch.save({f"k{i}": i for i in range(7)}, tmp_path / "wide.pt")  # only the first six keys are named
    with pytest.raises(CheckpointError, match=r"\(a dict with keys 'k0', 'k1', 'k2', 'k3', 'k4', 'k5', \.\.\.\), not"):
        load_checkpoint(tmp_path / "wide.pt")
    assert f"ampkit.restore(torch.load({str(p)!r}, weights_only=True), model=model, optimizer=optimizer)" in msg
    # ... and what the message says works:
    fresh, fresh_opt = _parts()
    sched = torch.optim.lr_scheduler.StepLR(fresh_opt, 1)
    r = ampkit.restore(torch.load(p, weights_only=True), model=fresh, optimizer=fresh_opt, scheduler=sched)
    assert r.step == 7 and r.notes[0] == "the checkpoint has no scheduler state: the scheduler starts fresh"
    assert r.notes[1].startswith("not an ampkit checkpoint: no RNG state was restored") and len(r.notes) == 2
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


def test_model_state_dict_file_is_explained_and_restorable(tmp_path):
    model, _ = _parts()
    p = tmp_path / "weights.pt"
    torch.save(model.state_dict(), p)
    with pytest.raises(CheckpointError, match=r"is a model state_dict \(2 tensors\).*model.load_state_dict"):
        load_checkpoint(p)
    fresh, _ = _parts()
    r = ampkit.restore(torch.load(p, weights_only=True), model=fresh)
    assert r.step == 0 and torch.equal(fresh.bias, model.bias)
    assert r.notes == ("a model state_dict: only the model was restored (no optimizer, engine or RNG state in it)",)


def test_not_a_dict_and_unknown_dicts(tmp_path):
    p = tmp_path / "list.pt"
    torch.save([1, 2], p)
    with pytest.raises(CheckpointError, match="not an ampkit checkpoint .*holds a list"):
        load_checkpoint(p)
    model, _ = _parts()
    with pytest.raises(CheckpointError, match="^restore got a dict that is neither an ampkit checkpoint.*keys: weights$"):
        ampkit.restore({"weights": 1}, model=model)
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        ampkit.restore(tmp_path / "nope.pt", model=model)


def test_newer_format_is_refused(tmp_path):
    model, opt = _parts()
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1)
    state = torch.load(p, weights_only=True)
    state["version"] = 99
    torch.save(state, p)
    with pytest.raises(CheckpointError, match="newer ampkit.*format 99"):
        load_checkpoint(p)
    state["version"] = 1  # an ampkit 0.1 file still loads
    torch.save(state, p)
    assert load_checkpoint(p)["step"] == 1


def test_bad_calls_are_usage_errors(tmp_path):
    model, opt = _parts()
    with pytest.raises(UsageError, match="restore takes a checkpoint path or a state dict, got int"):
        ampkit.restore(3, model=model)
    with pytest.raises(UsageError, match="keep must be >= 1"):
        CheckpointManager(tmp_path, keep=0)
    with pytest.raises(UsageError, match="step must be a non-negative int"):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=-1)
    with pytest.raises(UsageError):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1.5)


def test_model_that_does_not_fit_is_one_line(tmp_path):
    model, opt = _parts()
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, step=1)
    with pytest.raises(CheckpointError, match=r"^the checkpoint's model does not fit Sequential: missing 0.weight, "
                                              r"0.bias; unexpected weight, bias$"):
        ampkit.restore(p, model=nn.Sequential(nn.Linear(4, 2)))
    with pytest.raises(CheckpointError, match=r"^the checkpoint's model does not fit Linear: size mismatch for "
                                              r"weight") as err:
        ampkit.restore(p, model=nn.Linear(4, 3))
    assert len(str(err.value).splitlines()) == 1


# ---------------------------------------------------------------------------- several optimizers / schedulers
def _two():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opts = [torch.optim.AdamW(model[0].parameters(), lr=1e-2), torch.optim.SGD(model[1].parameters(), lr=1e-1)]
    scheds = [torch.optim.lr_scheduler.StepLR(opts[0], 2), torch.optim.lr_scheduler.LambdaLR(opts[1], lambda s: 0.9**s)]
    return model, opts, scheds


def test_lists_of_optimizers_and_schedulers_round_trip(tmp_path):
    model, opts, scheds = _two()
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        for o, s in zip(opts, scheds):
            o.step()
            s.step()
            o.zero_grad()
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opts, scheduler=scheds, step=3)
    fresh, fopts, fscheds = _two()
    r = ampkit.restore(p, model=fresh, optimizer=fopts, scheduler=fscheds)
    assert r.step == 3 and r.notes == ()
    for a, b in zip(fopts, opts):
        assert repr(a.state_dict()) == repr(b.state_dict())
    for a, b in zip(fscheds, scheds):
        assert a.last_epoch == b.last_epoch == 3 and a.get_last_lr() == b.get_last_lr()
    with pytest.raises(CheckpointError, match=r"has 2 optimizer\(s\), 1 given"):
        ampkit.restore(p, model=fresh, optimizer=fopts[0])
    with pytest.raises(CheckpointError, match=r"^the checkpoint's optimizer 1 state does not fit SGD: .*size"):
        ampkit.restore(p, model=fresh, optimizer=[fopts[0], torch.optim.SGD([fresh[1].weight], lr=0.1)])


def test_missing_parts_become_notes(tmp_path):
    model, opt = _parts()
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=None, step=2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    r = ampkit.restore(p, model=model, optimizer=opt, scheduler=sched, amp=ampkit.MixedPrecision("fp32"))
    assert any("no optimizer state" in n for n in r.notes)
    assert any("no scheduler state" in n for n in r.notes)
    assert any("no engine state" in n for n in r.notes)


# ---------------------------------------------------------------------------- wrapped models
def test_compiled_model_saves_plain_names_and_loads_both_ways(tmp_path):
    model, opt = _parts()
    compiled = torch.compile(model)  # wrapping only: nothing is compiled until the first call
    assert list(compiled.state_dict())[0].startswith("_orig_mod.")
    p = save_checkpoint(tmp_path / "a.pt", model=compiled, optimizer=opt, step=1)
    assert list(load_checkpoint(p)["model"]) == ["weight", "bias"]
    plain, _ = _parts()
    ampkit.restore(p, model=plain)
    assert torch.equal(plain.weight, model.weight)
    q = save_checkpoint(tmp_path / "b.pt", model=plain, optimizer=None, step=1)
    other, _ = _parts()
    ampkit.restore(q, model=torch.compile(other))
    assert torch.equal(other.weight, model.weight)


def test_compiled_submodule_and_raw_prefixed_state_dicts(tmp_path):
    """A compiled submodule puts _orig_mod. inside the names; a DDP model's raw state_dict() has module.:
    both load into the plain model."""
    def build():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))

    model = build()
    model[1] = torch.compile(model[1])
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=None, step=1)
    assert sorted(load_checkpoint(p)["model"]) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    target = build()
    target[1] = torch.compile(target[1])
    with torch.no_grad():
        for t in target.parameters():
            t.zero_()
    ampkit.restore(p, model=target)
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), model.parameters()))
    raw = {"module." + k: v for k, v in build().state_dict().items()}
    plain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    ampkit.restore({"model": raw}, model=plain)
    assert torch.equal(plain[0].weight, build()[0].weight)


def test_ddp_model_checkpoints_move_to_a_plain_model_and_back(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model, opt = _parts()
        ddp = nn.parallel.DistributedDataParallel(model)
        assert list(ddp.state_dict())[0].startswith("module.")
        p = save_checkpoint(tmp_path / "a.pt", model=ddp, optimizer=opt, step=1)
        assert list(load_checkpoint(p)["model"]) == ["weight", "bias"]
        plain, _ = _parts()
        ampkit.restore(p, model=plain)
        assert torch.equal(plain.weight, model.weight)
        other = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        ampkit.restore(save_checkpoint(tmp_path / "b.pt", model=plain, optimizer=None, step=1), model=other)
        assert torch.equal(other.module.weight, model.weight)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- accumulation windows
def test_mid_accumulation_save_is_refused(tmp_path):
    model, opt = _parts()
    amp = ampkit.MixedPrecision("fp32", accumulation_steps=2)
    with amp.autocast():
        loss = model(torch.randn(3, 4)).sum()
    amp.backward(loss)
    amp.step(opt)  # micro-step 1 of 2: no update
    with pytest.raises(CheckpointError, match=r"middle of an accumulation window \(1 of 2 micro-steps done\)"):
        save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, amp=amp, step=0)
    assert list(tmp_path.iterdir()) == []
    amp.backward(model(torch.randn(3, 4)).sum())
    amp.step(opt)  # the window is complete: saving is exact again
    assert load_checkpoint(save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, amp=amp, step=1))["step"] == 1


def test_plain_checkpoint_scaler_goes_into_the_engine():
    """The tutorials' {"model", "optimizer", "scaler"} dict: the GradScaler state feeds an fp16 engine's scaler;
    an engine without one says the state was dropped."""
    model, opt = _parts()
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    state = {"model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
             "scaler": scaler.state_dict(), "step": 3}
    amp = ampkit.MixedPrecision("fp16")
    r = ampkit.restore(state, model=model, optimizer=opt, amp=amp)
    assert r.step == 3 and amp.stats()["scale"] == 128.0
    r = ampkit.restore(state, model=model, optimizer=opt, amp=ampkit.MixedPrecision("bf16"))
    assert any("scaler state was dropped" in n for n in r.notes)


def test_fsdp2_keeps_plain_names_and_its_shards_are_refused_in_one_file(tmp_path):
    """fully_shard shards in place: the names stay plain, the values are DTensors. torch.load(weights_only=True)
    would read them back, but a one-file checkpoint of shards cannot feed a plain model: refused, naming DCP."""
    import torch.distributed as dist

    from ampkit.compat import fsdp2

    fully_shard, _ = fsdp2()

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        names = list(model.state_dict())
        fully_shard(model)
        assert list(model.state_dict()) == names
        with pytest.raises(CheckpointError, match=r'^model\["0.weight"\]: .*DTensor is not loadable .*DCP'):
            save_checkpoint(tmp_path / "a.pt", model=model, optimizer=None, step=1)
    finally:
        dist.destroy_process_group()


def test_rng_states_of_python_numpy_and_torch_come_back():
    import random

    from ampkit.checkpoint import rng_state, set_rng_state

    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    set_rng_state(state)
    got = (random.random(), np.random.rand(), torch.rand(1))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_engine_state_comes_back_and_its_notes_are_returned_not_warned(tmp_path):
    """A backed-off fp16 scale and a skipped step survive save/restore; restoring into another precision
    returns the engine's note instead of warning."""
    import warnings

    model, opt = _parts()
    amp = ampkit.MixedPrecision("fp16", init_scale=2.0**10)
    amp.backward(model(torch.full((2, 4), float("inf"))).sum())
    amp.step(opt)  # non-finite: skipped, the scale backs off
    saved = amp.stats()
    assert saved["skipped"] == 1 and saved["scale"] == 2.0**9
    p = save_checkpoint(tmp_path / "a.pt", model=model, optimizer=opt, amp=amp, step=1)
    fresh = ampkit.MixedPrecision("fp16")
    assert ampkit.restore(p, model=model, optimizer=opt, amp=fresh).notes == ()
    got = fresh.stats()
    assert (got["skipped"], got["scale"], got["steps"]) == (saved["skipped"], saved["scale"], saved["steps"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = ampkit.restore(p, model=model, optimizer=opt, amp=ampkit.MixedPrecision("bf16"))
    assert len(r.notes) == 1 and "scaler state dropped" in r.notes[0]
