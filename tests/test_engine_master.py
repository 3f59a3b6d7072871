"""weights="bf16": BF16 weights with a 16-bit remainder, updated exactly as FP32 (ampkit.engine.master).

The claim: the engine's run is bit for bit a BF16 model trained with a separate FP32 master copy (apex's O2 scheme:
the optimizer steps the FP32 master, the model's BF16 weights are its rounding), while storing no FP32 copy; and a
checkpoint resumes it exactly."""

import copy

import pytest
import torch
from torch import nn

import ampkit
from ampkit.engine import MixedPrecision
from ampkit.engine.master import join, split
from ampkit.errors import UsageError
from ampkit.tasks.digits import load_split


def _bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def test_split_join_is_exact_on_every_kind_of_value():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), dtype=torch.int32, generator=g)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-40, -1e-40, 3.4e38, -3.4e38, 1.0, -1.0])
    for x in (bits.view(torch.float32), special, torch.randn(50_000, generator=g)):
        high, rem = split(x)
        assert high.dtype == torch.bfloat16 and rem.dtype == torch.int16
        assert torch.equal(_bits(join(high, rem)), _bits(x))


def test_split_rounds_to_nearest_and_differs_from_round_to_even_only_on_ties():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300_000, generator=g) * 7
    high, _ = split(x)
    err = (high.float() - x).abs()
    assert bool((err <= (x.to(torch.bfloat16).float() - x).abs()).all())  # as near as torch's own rounding
    differs = _bits(high) != _bits(x.to(torch.bfloat16))
    low16 = x.view(torch.int32) & 0xFFFF
    assert bool((low16[differs] == 0x8000).all())  # only exact ties round differently (away from zero)


def _data(steps, seed=0):
    x, y, _, _ = load_split()
    g = torch.Generator().manual_seed(seed)
    idx = [torch.randint(0, len(x), (32,), generator=g) for _ in range(steps)]
    return [(x[i].flatten(1), y[i]) for i in idx]


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.LayerNorm(96), nn.GELU(), nn.Linear(96, 10))


def _opt(params, kind):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, fused=True)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _o2_reference(model, data, kind, *, clip, accumulation=1, sched=False):
    """apex O2: a BF16 model, an FP32 master copy the optimizer steps, the model's weights its rounding."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    master = [p.detach().clone().requires_grad_(True) for p in params]
    for p, m in zip(params, master):
        p.data = split(m.detach())[0]
    opt = _opt(master, kind)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5) if sched else None
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y) / accumulation
        loss.backward()
        if (i + 1) % accumulation:
            continue
        for p, m in zip(params, master):
            m.grad = p.grad.float()
            p.grad = None
        if clip:
            torch.nn.utils.clip_grad_norm_(master, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        for p, m in zip(params, master):
            p.data.copy_(split(m.detach())[0])
    return model, master, opt


def _engine(model, data, kind, *, clip, accumulation=1, sched=False):
    model = copy.deepcopy(model)
    amp = MixedPrecision("bf16", weights="bf16", device="cpu", max_grad_norm=clip, accumulation_steps=accumulation)
    amp.attach(model)
    opt = _opt(model.parameters(), kind)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5) if sched else None
    for x, y in data:
        with amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        amp.backward(loss)
        amp.step(opt, scheduler=scheduler)
    return model, amp, opt


@pytest.mark.parametrize("kind, clip, accumulation, sched", [
    ("adamw", 1.0, 1, False), ("adamw-fused", 0.5, 1, True), ("sgd", None, 2, True)])
def test_bf16_weights_are_bit_for_bit_an_fp32_master_run(kind, clip, accumulation, sched):
    data = _data(120 * accumulation)
    init = _model()
    ref_model, master, ref_opt = _o2_reference(init, data, kind, clip=clip, accumulation=accumulation, sched=sched)
    model, amp, opt = _engine(init, data, kind, clip=clip, accumulation=accumulation, sched=sched)
    assert amp.steps == 120
    for p, r, m in zip(model.parameters(), ref_model.parameters(), master):
        assert p.dtype == torch.bfloat16
        assert torch.equal(_bits(p.detach()), _bits(r.detach()))           # the BF16 weights the model computes with
        assert torch.equal(_bits(join(p.detach(), amp.master._rem[id(p)])), _bits(m.detach()))  # the exact FP32 values
    for p, m in zip(model.parameters(), master):  # the optimizer's states are FP32 and equal
        s, rs = opt.state[p], ref_opt.state[m]
        for key, value in rs.items():
            if torch.is_tensor(value) and value.dim():
                assert s[key].dtype == torch.float32 and torch.equal(s[key], value)
    assert not torch.equal(_bits(next(model.parameters()).detach()), _bits(split(next(init.parameters()).detach())[0]))


def test_no_fp32_copy_of_the_weights_is_stored():
    init = _model()
    model, amp, opt = _engine(init, _data(5), "adamw", clip=1.0)
    n = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes == 2 * n and amp.master.remainder_bytes == 2 * n
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none) after the step
    fp32_tensors = [t for t in vars(amp.master).get("_rem", {}).values() if t.dtype == torch.float32]
    assert not fp32_tensors
    state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                      if torch.is_tensor(v) and v.dim())
    assert state_bytes == 8 * n


def test_checkpoint_resumes_the_exact_fp32_values(tmp_path):
    data = _data(40)
    init = _model()
    whole_model, whole_amp, _ = _engine(init, data, "adamw", clip=1.0)

    model, amp, opt = _engine(init, data[:20], "adamw", clip=1.0)
    ampkit.save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, amp=amp, step=20)
    fresh = _model(seed=5)  # other weights: everything comes from the checkpoint
    amp2 = MixedPrecision("bf16", weights="bf16", device="cpu", max_grad_norm=1.0)
    amp2.attach(fresh)
    opt2 = _opt(fresh.parameters(), "adamw")
    r = ampkit.restore(tmp_path / "c.pt", model=fresh, optimizer=opt2, amp=amp2)
    assert r.step == 20
    assert all(v.dtype == torch.float32 for s in opt2.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
    for x, y in data[20:]:
        with amp2.autocast():
            loss = nn.functional.cross_entropy(fresh(x), y)
        amp2.backward(loss)
        amp2.step(opt2)
    for p, q in zip(fresh.parameters(), whole_model.parameters()):
        assert torch.equal(_bits(p.detach()), _bits(q.detach()))
        assert torch.equal(amp2.master._rem[id(p)], whole_amp.master._rem[id(q)])


def test_pure_bf16_loses_the_small_updates_that_bf16_weights_keep():
    data = _data(30)
    init = _model()

    def run(weights):
        model = copy.deepcopy(init)
        amp = MixedPrecision("bf16", weights=weights, device="cpu")
        amp.attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-5)  # updates far below half a BF16 step of weights ~0.1
        for x, y in data:
            with amp.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            amp.backward(loss)
            amp.step(opt)
        return model, amp

    pure, _ = run("bf16-pure")
    exact, amp = run("bf16")
    start = split(init[0].weight.detach())[0]  # the first layer's weight: its updates are the smallest
    pure_moved = (_bits(pure[0].weight.detach()) != _bits(start)).float().mean().item()
    exact_fp32 = join(exact[0].weight.detach(), amp.master._rem[id(exact[0].weight)])
    exact_moved = (exact_fp32 != init[0].weight.detach()).float().mean().item()
    assert pure_moved < 0.05 and exact_moved > 0.5, (pure_moved, exact_moved)  # pure BF16 rounds the updates away


def test_weights_bf16_needs_bf16_precision_and_a_known_name():
    with pytest.raises(UsageError, match="needs BF16 precision"):
        MixedPrecision("fp32", weights="bf16", device="cpu")
    with pytest.raises(UsageError, match="weights takes"):
        MixedPrecision("bf16", weights="fp8", device="cpu")


def test_attach_after_training_started_is_refused():
    model = _model()
    amp = MixedPrecision("bf16", weights="bf16", device="cpu")
    model(torch.randn(2, 64)).sum().backward()
    with pytest.raises(UsageError, match="before training"):
        amp.attach(model)
