import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from ampkit.checkpoint import CheckpointManager, load_checkpoint, save_checkpoint
from ampkit.errors import CheckpointError


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
    assert sorted(os.listdir(tmp_path)) == ["step-00000001.pt"]  # no temp file left behind
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
