"""Bit-exact resume through the public API, written the way docs/api/checkpoints.md tells a user to:
train with dropout and data drawn from the global RNG, save, restore into fresh objects, continue.
The resumed run must equal the uninterrupted one bit for bit on the CPU."""

import pytest
import torch
from torch import nn

import ampkit

STEPS, SAVE_AT, BAD_STEP = 12, 6, 3  # BAD_STEP: a planted non-finite batch before the save


def build(precision, scheduler):
    torch.manual_seed(0)  # fresh objects start from the same seed: only restore() can bring step SAVE_AT's RNG back
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-2, total_steps=STEPS) if scheduler else None
    # fp16: a small growth interval so the scale grows (and backs off at BAD_STEP) within the run
    if precision == "bf16-weights":  # BF16 weights with remainders: the exact FP32 values must resume too
        amp = ampkit.MixedPrecision("bf16", weights="bf16", max_grad_norm=1.0)
        amp.attach(model)
    else:
        amp = ampkit.MixedPrecision(precision, max_grad_norm=1.0, init_scale=2.0**8, growth_interval=2)
    return model, opt, sched, amp


def train(model, opt, sched, amp, start, stop):
    losses = []
    for step in range(start, stop):
        x = torch.randn(32, 16)  # the data order comes from the global RNG too
        y = x[:, :4].argmax(1)
        if step == BAD_STEP:
            x[0, 0] = float("inf")
        with amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        amp.backward(loss)
        amp.step(opt, scheduler=sched)
        losses.append(loss.detach().float())
    return losses


def snapshot(model, opt, sched, amp):
    return {"params": [p.detach().clone() for p in model.parameters()],
            "opt": [t.clone() for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)],
            "lr": [g["lr"] for g in opt.param_groups], "sched": sched.state_dict() if sched else None,
            "stats": amp.stats(), "rng": torch.rand(4),
            "remainders": [r.clone() for r in amp.master.state_dict().values()] if amp.master is not None else []}


@pytest.mark.parametrize("scheduler", [False, True], ids=["no-sched", "sched"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "bf16-weights"])
def test_resume_is_bit_exact(precision, scheduler, tmp_path):
    parts = build(precision, scheduler)
    ref_losses = train(*parts, 0, STEPS)
    ref = snapshot(*parts)

    parts = build(precision, scheduler)
    first = train(*parts, 0, SAVE_AT)
    model, opt, sched, amp = parts
    ampkit.save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, scheduler=sched, amp=amp, step=SAVE_AT)
    del model, opt, sched, amp, parts

    model, opt, sched, amp = build(precision, scheduler)
    r = ampkit.restore(tmp_path / "ckpt.pt", model=model, optimizer=opt, scheduler=sched, amp=amp)
    assert r.step == SAVE_AT and r.notes == ()
    rest = train(model, opt, sched, amp, r.step, STEPS)
    got = snapshot(model, opt, sched, amp)

    # the planted step's loss is NaN in both runs: compared bit for bit with NaN equal to NaN
    torch.testing.assert_close(torch.stack(first + rest), torch.stack(ref_losses), rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(ref_losses[BAD_STEP]) and torch.isfinite(torch.stack(ref_losses[BAD_STEP + 1:])).all()
    assert all(torch.equal(a, b) for a, b in zip(got["params"], ref["params"]))
    assert len(got["opt"]) == len(ref["opt"]) and all(torch.equal(a, b) for a, b in zip(got["opt"], ref["opt"]))
    assert got["lr"] == ref["lr"] and got["sched"] == ref["sched"]
    assert got["stats"] == ref["stats"]
    assert all(torch.equal(a, b) for a, b in zip(got["remainders"], ref["remainders"]))
    assert len(got["remainders"]) == (4 if precision == "bf16-weights" else 0)
    assert ref["stats"]["skipped"] == 1  # the planted batch was skipped (fp16: the scale backed off)
    assert torch.equal(got["rng"], ref["rng"])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_resume_on_the_accelerator_restores_its_rng(precision, tmp_path):
    """On the GPU: dropout draws from the device's generator, which restore() must bring back. Same process,
    same kernels: the resumed run equals the uninterrupted one."""
    dev = ampkit.detect_device()
    torch_dev = dev.torch_device

    def build_on_device():
        model, opt, sched, amp = build(precision, True)
        model.to(torch_dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        amp = ampkit.MixedPrecision(precision, device=dev, max_grad_norm=1.0, init_scale=2.0**8, growth_interval=2)
        return model, opt, amp

    def run(model, opt, amp, start, stop):
        for _ in range(start, stop):
            x = torch.randn(32, 16, device=torch_dev)
            with amp.autocast():
                loss = nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
            amp.backward(loss)
            amp.step(opt)

    ref = build_on_device()
    run(*ref, 0, STEPS)
    model, opt, amp = build_on_device()
    run(model, opt, amp, 0, SAVE_AT)
    ampkit.save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, amp=amp, step=SAVE_AT)
    model, opt, amp = build_on_device()
    torch.randn(100, device=torch_dev)  # move the device RNG: only restore() can bring it back
    r = ampkit.restore(tmp_path / "ckpt.pt", model=model, optimizer=opt, amp=amp)
    run(model, opt, amp, r.step, STEPS)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref[0].parameters()))
