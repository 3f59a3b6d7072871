"""On a CUDA/MUSA card: the multi-optimizer step, the scheduler path and train_step make no host sync in the
steady state, and the scheduler path gives the reference loop's numbers. Run through the device tool:
``python -m pytest -m gpu tests/test_engine_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as L

import ampkit.engine.schedule
from ampkit.device import detect_device
from ampkit.engine import MixedPrecision

pytestmark = pytest.mark.gpu


def _model(dev, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to(dev.torch_device)


def _batches(dev, n, planted=()):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(32, 64, generator=g) * (float("inf") if i in planted else 1.0)
        out.append((x.to(dev.torch_device), torch.randint(0, 10, (32,), generator=g).to(dev.torch_device)))
    return out


def _loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _steady(dev, step, warmup=3, steps=10):
    for i in range(warmup):  # lazy state (optimizer, scaler, counters, schedule table) is made here
        step(i)
    dev.synchronize()
    dev.set_sync_debug_mode("error")
    try:
        for i in range(warmup, warmup + steps):
            step(i)  # raises on any synchronising call
    finally:
        dev.set_sync_debug_mode(0)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_two_optimizers_and_schedulers_make_no_host_sync(precision, monkeypatch):
    monkeypatch.setattr(ampkit.engine.schedule, "CHUNK", 4)  # the schedule table is extended during the steady steps
    dev = detect_device()
    model = _model(dev)
    o1 = torch.optim.AdamW(model[0].parameters(), lr=1e-3, fused=True)
    o2 = torch.optim.SGD(model[2].parameters(), lr=1e-2, momentum=0.9, fused=True)
    s1 = L.LambdaLR(o1, lambda s: 1 / (1 + s))
    s2 = L.SequentialLR(o2, [L.LinearLR(o2, 0.1, total_iters=3), L.CosineAnnealingLR(o2, 20)], milestones=[3])
    amp = MixedPrecision(precision, max_grad_norm=1.0, device=dev)
    batches = _batches(dev, 4, planted={1})

    def step(i):
        with amp.autocast():
            loss = _loss(model, batches[i % 4])
        amp.backward(loss)
        amp.step(o1, o2, scheduler=[s1, s2])

    _steady(dev, step)
    stats = amp.stats()
    assert stats["steps"] == 13 and stats["skipped"] == 3  # the batches of i = 1, 5, 9
    assert s1.last_epoch == s2.last_epoch == 13 - 3


def test_train_step_with_accumulation_makes_no_host_sync():
    dev = detect_device()
    model = _model(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sched = L.OneCycleLR(opt, max_lr=1e-3, total_steps=100, cycle_momentum=False)
    amp = MixedPrecision("fp16", max_grad_norm=1.0, accumulation_steps=2, device=dev)
    batches = _batches(dev, 4)
    _steady(dev, lambda i: amp.train_step(model, _loss, [batches[(2 * i) % 4], batches[(2 * i + 1) % 4]], opt,
                                          scheduler=sched))
    assert amp.stats()["steps"] == 13 and sched.last_epoch == 13


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_scheduler_path_matches_the_reference_loop_on_the_device(precision):
    """With a tensor lr given by the user (kept as it is), the device-driven schedule is bit for bit the
    reference ``if not skipped: scheduler.step()``."""
    dev = detect_device()
    planted = {2, 5}
    batches = _batches(dev, 10, planted=planted)

    def make():
        model = _model(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device=dev.torch_device), fused=True)
        return model, opt, L.StepLR(opt, step_size=2, gamma=0.7)

    model, opt, sched = make()
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10, growth_interval=3, enabled=precision == "fp16")
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    for b in batches:
        with torch.autocast(dev.type, dtype=dtype):
            loss = _loss(model, b)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        skipped = not bool(torch.isfinite(norm))
        if precision == "fp16":
            scaler.step(opt)
        elif not skipped:
            opt.step()
        scaler.update()
        if not skipped:
            sched.step()
        opt.zero_grad()
    ref = [p.detach().clone() for p in model.parameters()]

    model, opt, sched2 = make()
    amp = MixedPrecision(precision, max_grad_norm=1.0, init_scale=2.0**10, growth_interval=3, min_scale=0.0,
                         device=dev)
    for b in batches:
        amp.train_step(model, _loss, [b], opt, scheduler=sched2)
    for a, b in zip(ref, model.parameters()):
        assert torch.equal(a, b)
    amp.sync_schedulers()
    assert sched2.last_epoch == sched.last_epoch == len(batches) - len(planted)
