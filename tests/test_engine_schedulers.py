"""``amp.step(..., scheduler=...)``: a skipped step does not advance the schedule, bit for bit against the
reference ``if not skipped: scheduler.step()``; with fused optimizers without a host read per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as L

import ampkit.engine.schedule
from ampkit.engine import MixedPrecision
from ampkit.errors import UsageError

PLANTED = {2, 5, 6, 11}


def _make(kind, sched_name, lr=0.05):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": lr / 2}]
    if kind == "fused":
        opt = torch.optim.AdamW(groups, lr=lr, fused=True)
    elif kind == "fused-sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=0.9, fused=True)
    else:
        opt = torch.optim.AdamW(groups, lr=lr, foreach=True)
    if sched_name == "step":
        sched = L.StepLR(opt, step_size=3, gamma=0.5)  # chainable form
    elif sched_name == "lambda":
        sched = L.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    elif sched_name == "onecycle":
        sched = L.OneCycleLR(opt, max_lr=[lr, lr / 2], total_steps=40)
    else:
        warm = L.LinearLR(opt, start_factor=0.1, total_iters=4)
        sched = L.SequentialLR(opt, [warm, L.CosineAnnealingLR(opt, T_max=10)], milestones=[4])
    return model, opt, sched


def _data(n):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)]


def _loss(model, x, y, i):
    return nn.functional.cross_entropy(model(x * (float("inf") if i in PLANTED else 1.0)), y)


def _lrs(opt):
    return [float(g["lr"]) for g in opt.param_groups]


def _reference(kind, sched_name, name, n):
    model, opt, sched = _make(kind, sched_name)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3, enabled=name == "fp16")
    lrs = []
    for i, (x, y) in enumerate(_data(n)):
        with torch.autocast("cpu", dtype=torch.float16 if name == "fp16" else torch.bfloat16):
            loss = _loss(model, x, y, i)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        skipped = not bool(torch.isfinite(norm))
        if name == "fp16":
            scaler.step(opt)
        elif not skipped:
            opt.step()
        scaler.update()
        if not skipped:
            sched.step()
        opt.zero_grad()
        lrs.append(_lrs(opt))
    return model, sched, lrs


@pytest.mark.parametrize("sched_name", ["step", "lambda", "onecycle", "sequential"])
@pytest.mark.parametrize("kind", ["fused", "fused-sgd", "foreach"])
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_skipped_steps_do_not_advance_the_schedule(name, kind, sched_name, monkeypatch):
    monkeypatch.setattr(ampkit.engine.schedule, "CHUNK", 4)  # extend the device table several times in 14 steps
    n = 14
    ref_model, ref_sched, ref_lrs = _reference(kind, sched_name, name, n)
    model, opt, sched = _make(kind, sched_name)
    amp = MixedPrecision(name, max_grad_norm=1.0, init_scale=2.0**8, growth_interval=3, min_scale=0.0)
    lrs = []
    for i, (x, y) in enumerate(_data(n)):
        with amp.autocast():
            loss = _loss(model, x, y, i)
        amp.backward(loss)
        amp.step(opt, scheduler=sched)
        lrs.append(_lrs(opt))
    assert lrs == ref_lrs  # the learning rate of every step, every group
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert amp.stats()["skipped"] == len(PLANTED)
    # stats() brought the scheduler object to the true position
    assert sched.last_epoch == ref_sched.last_epoch == n - len(PLANTED)
    assert sched.get_last_lr() == ref_sched.get_last_lr()
    if kind.startswith("fused"):
        assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)


def test_scheduler_state_dict_after_sync_resumes_the_schedule():
    model, opt, sched = _make("fused", "onecycle")
    amp = MixedPrecision("bf16", max_grad_norm=1.0)
    for i, (x, y) in enumerate(_data(9)):
        amp.backward(_loss(model, x, y, i))
        amp.step(opt, scheduler=sched)
    amp_state = amp.state_dict()  # syncs the scheduler first
    saved = sched.state_dict()
    assert saved["last_epoch"] == 9 - len({i for i in PLANTED if i < 9})
    # resume: a fresh scheduler on a fresh optimizer continues from the true position
    model2, opt2, sched2 = _make("fused", "onecycle")
    sched2.load_state_dict(saved)
    amp2 = MixedPrecision("bf16", max_grad_norm=1.0)
    amp2.load_state_dict(amp_state)
    for i, (x, y) in list(enumerate(_data(12)))[9:]:
        amp.backward(_loss(model, x, y, i))
        amp.step(opt, scheduler=sched)
        amp2.backward(_loss(model2, x, y, i))
        amp2.step(opt2, scheduler=sched2)
    amp.sync_schedulers()
    amp2.sync_schedulers()
    assert sched.last_epoch == sched2.last_epoch and _lrs(opt) == _lrs(opt2)


def test_a_list_of_schedulers_one_per_optimizer():
    model, opt, sched = _make("fused", "step")
    head = nn.Linear(3, 3)
    opt2 = torch.optim.SGD(head.parameters(), lr=0.1)
    sched2 = L.StepLR(opt2, step_size=1, gamma=0.5)
    amp = MixedPrecision("fp32")
    for i, (x, y) in enumerate(_data(4)):
        amp.backward(nn.functional.cross_entropy(head(model(x * (float("nan") if i == 1 else 1.0))), y))
        amp.step(opt, opt2, scheduler=[sched, sched2])
    amp.sync_schedulers()
    assert sched.last_epoch == sched2.last_epoch == 3
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_scheduler_misuse_is_a_usage_error():
    model, opt, _ = _make("fused", "step")
    amp = MixedPrecision("fp32")
    x, y = _data(1)[0]
    amp.backward(nn.functional.cross_entropy(model(x), y))
    with pytest.raises(UsageError, match="ReduceLROnPlateau.*scheduler.step\\(val_loss\\)"):
        amp.step(opt, scheduler=L.ReduceLROnPlateau(opt))
    with pytest.raises(UsageError, match="scheduler= takes torch LR schedulers"):
        amp.step(opt, scheduler=object())


def test_last_skipped_is_a_device_flag():
    model, opt, _ = _make("fused", "step")
    amp = MixedPrecision("bf16")
    assert float(amp.last_skipped) == 0.0
    for i, (x, y) in enumerate(_data(3)):
        amp.backward(_loss(model, x, y, i))
        amp.step(opt)
        assert isinstance(amp.last_skipped, torch.Tensor)
        assert bool(amp.last_skipped) is (i in PLANTED)


def test_a_finite_schedule_is_not_stepped_past_its_end_ahead_of_time():
    """OneCycleLR refuses to step past total_steps: the table ends there, the run is unaffected until the
    true position gets past it, and then syncing raises the scheduler's own error, as torch would."""
    model, opt, sched = _make("fused", "onecycle")  # total_steps=40
    amp = MixedPrecision("bf16", max_grad_norm=1.0)
    data = _data(41)
    for i, (x, y) in enumerate(data[:40]):
        amp.backward(nn.functional.cross_entropy(model(x), y))
        amp.step(opt, scheduler=sched)
        if i == 38:
            amp.sync_schedulers()
            assert sched.last_epoch == 39
    x, y = data[40]
    amp.backward(nn.functional.cross_entropy(model(x), y))
    amp.step(opt, scheduler=sched)
    with pytest.raises(ValueError, match="Tried to step"):
        amp.sync_schedulers()


def test_save_checkpoint_stores_the_true_scheduler_position(tmp_path):
    from ampkit.checkpoint import load_checkpoint, save_checkpoint

    model, opt, sched = _make("fused", "lambda")
    amp = MixedPrecision("bf16", max_grad_norm=1.0)
    for i, (x, y) in enumerate(_data(8)):
        amp.backward(_loss(model, x, y, i))
        amp.step(opt, scheduler=sched)
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, amp=amp, step=8, scheduler=sched)
    saved = load_checkpoint(path)["scheduler"]
    assert saved["last_epoch"] == 8 - len({i for i in PLANTED if i < 8})
