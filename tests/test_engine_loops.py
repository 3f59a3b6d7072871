"""The engine in real training loops, bit for bit against torch's documented torch.amp patterns on the CPU:
several optimizers on one backward, separate backward/step pairs, accumulation, param groups added
mid-run, clipping subsets, and FP16 runs whose scale grows and backs off mid-run with planted inf steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.engine import MixedPrecision

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PLANTED = {3, 7}  # steps whose input is multiplied by inf


def _two_part_model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(8, 16), nn.Linear(16, 4)


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(n)]


def _optimizers(a, b, kind):
    if kind == "fused":
        return torch.optim.AdamW(a.parameters(), lr=1e-2, fused=True), torch.optim.AdamW(b.parameters(), lr=1e-2,
                                                                                            fused=True)
    if kind == "mixed":  # a fused one (skips on the device) next to a plain one (skips on the host)
        return torch.optim.AdamW(a.parameters(), lr=1e-2, fused=True), torch.optim.SGD(b.parameters(), lr=0.1,
                                                                                          momentum=0.9)
    return (torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, foreach=True),
            torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False))


def _loss(a, b, x, y, i):
    if i in PLANTED:
        x = x * float("inf")
    return nn.functional.cross_entropy(b(torch.relu(a(x))), y)


def _state(*modules):
    return [p.detach().clone() for m in modules for p in m.parameters()]


def _assert_same(ref, got):
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert torch.equal(r, g)


def _amp(name, **kw):
    kw.setdefault("growth_interval", 2)  # the scale grows every 2 good steps and backs off on the planted ones
    kw.setdefault("init_scale", 2.0**8)
    kw.setdefault("min_scale", 0.0)
    return MixedPrecision(name, **kw)


@pytest.mark.parametrize("kind", ["fused", "foreach", "mixed"])
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_two_optimizers_one_backward_clipped_together_match_torch(name, kind):
    """torch: scale(loss).backward(); unscale_(o1); unscale_(o2); clip_grad_norm_(all); step(o1); step(o2);
    update(). ampkit: amp.step(o1, o2)."""
    data = _batches(10)
    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, kind)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=name == "fp16")
    scales = []
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=DTYPES[name]):
            loss = _loss(a, b, x, y, i)
        scaler.scale(loss).backward()
        scaler.unscale_(o1)
        scaler.unscale_(o2)
        norm = nn.utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 1.0)
        if name == "fp16":
            scaler.step(o1)
            scaler.step(o2)
        elif torch.isfinite(norm):
            o1.step()
            o2.step()
        scaler.update()
        scales.append(scaler.get_scale())
        o1.zero_grad()
        o2.zero_grad()
    ref = _state(a, b)

    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, kind)
    amp = _amp(name, max_grad_norm=1.0)
    got_scales = []
    for i, (x, y) in enumerate(data):
        with amp.autocast():
            loss = _loss(a, b, x, y, i)
        amp.backward(loss)
        assert amp.step(o1, o2) is True
        got_scales.append(amp.stats()["scale"])
    _assert_same(ref, _state(a, b))
    if name == "fp16":
        assert got_scales == scales and max(scales) > scales[0] and any(s < t for t, s in zip(scales, scales[1:]))
    assert amp.stats()["skipped"] == len(PLANTED) and amp.steps == len(data)


@pytest.mark.parametrize("kind", ["fused", "foreach"])
def test_step_each_optimizer_after_one_backward_is_torchs_pattern(kind):
    """``amp.step(o1); amp.step(o2)`` after one backward: one scale for both, one update after both (the
    engine used to update the scale between them, applying 0.5x or 2x the gradient to o2)."""
    data = _batches(10)
    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, kind)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = _loss(a, b, x, y, i)
        scaler.scale(loss).backward()
        scaler.step(o1)
        scaler.step(o2)
        scaler.update()
        o1.zero_grad()
        o2.zero_grad()
    ref, ref_scale = _state(a, b), scaler.get_scale()

    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, kind)
    amp = _amp("fp16")
    for i, (x, y) in enumerate(data):
        with amp.autocast():
            loss = _loss(a, b, x, y, i)
        amp.backward(loss)
        amp.step(o1)
        amp.step(o2)
    _assert_same(ref, _state(a, b))
    assert amp.stats()["scale"] == ref_scale


def test_gan_pairs_each_with_its_own_backward_match_torch():
    """D and G: separate backward/step pairs, each followed by its own scaler update in torch."""
    data = _batches(8)

    def run(engine):
        d, g = _two_part_model(3)
        od, og = torch.optim.AdamW(d.parameters(), lr=1e-2, fused=True), torch.optim.SGD(g.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
        amp = _amp("fp16") if engine else None
        for i, (x, y) in enumerate(data):
            for part, opt, seed in ((d, od, 0), (g, og, 1)):
                other = g if part is d else d
                with torch.autocast("cpu", dtype=torch.float16):
                    h = torch.relu(d(x * (float("inf") if i in PLANTED and seed == 0 else 1.0)))
                    loss = nn.functional.cross_entropy(g(h if part is g else h), y)
                if engine:
                    other.zero_grad(set_to_none=True)
                    amp.backward(loss)
                    amp.step(opt)
                else:
                    other.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad()
        return _state(d, g), (amp.stats()["scale"] if engine else scaler.get_scale())

    (ref, ref_scale), (got, scale) = run(False), run(True)
    _assert_same(ref, got)
    assert scale == ref_scale


@pytest.mark.parametrize("name", ["fp16", "fp32"])
def test_two_optimizers_with_accumulation_both_step_each_window(name):
    """The shared micro-step counter used to let one optimizer never step (its gradients never zeroed)."""
    data = _batches(12)
    acc = 3
    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, "fused")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=name == "fp16")
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=DTYPES[name], enabled=name != "fp32"):
            loss = _loss(a, b, x, y, i) / acc
        scaler.scale(loss).backward()
        if (i + 1) % acc == 0:
            scaler.unscale_(o1)
            scaler.unscale_(o2)
            norm = nn.utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 1.0)
            if name == "fp16":
                scaler.step(o1)
                scaler.step(o2)
            elif torch.isfinite(norm):
                o1.step()
                o2.step()
            scaler.update()
            o1.zero_grad()
            o2.zero_grad()
    ref = _state(a, b)

    a, b = _two_part_model()
    o1, o2 = _optimizers(a, b, "fused")
    amp = _amp(name, max_grad_norm=1.0, accumulation_steps=acc)
    stepped = []
    for i, (x, y) in enumerate(data):
        assert amp.accumulating is ((i + 1) % acc != 0)
        with amp.autocast():
            loss = _loss(a, b, x, y, i)
        amp.backward(loss)
        stepped.append(amp.step(o1, o2))
    _assert_same(ref, _state(a, b))
    assert stepped == [(i + 1) % acc == 0 for i in range(len(data))]
    assert amp.steps == len(data) // acc and amp.accumulation_pending == 0


def test_separate_pairs_with_accumulation_each_step_every_window():
    """GAN-style pairs with accumulation: each optimizer counts its own backward -> step cycles."""
    d, g = _two_part_model()
    od, og = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.SGD(g.parameters(), lr=0.1)
    amp = MixedPrecision("fp32", accumulation_steps=2)
    x, y = _batches(1)[0]
    steps = []
    for _ in range(4):
        for opt in (od, og):
            amp.backward(nn.functional.cross_entropy(g(torch.relu(d(x))), y))
            steps.append((type(opt).__name__, amp.step(opt, zero_grad=False)))
    assert [s for _, s in steps] == [False, False, True, True, False, False, True, True]


def test_param_group_added_mid_run_is_clipped_and_checked():
    """Parameters come from param_groups at every step: a group added after the first step is in the
    global norm, and its non-finite gradient skips the step in BF16 (it used to go NaN, 'skipped 0')."""
    a, b = _two_part_model()
    opt = torch.optim.AdamW(a.parameters(), lr=1e-2, fused=True)
    amp = MixedPrecision("bf16", max_grad_norm=1e-3)
    x, y = _batches(1)[0]
    amp.backward(nn.functional.cross_entropy(b(torch.relu(a(x))), y))
    amp.step(opt)
    opt.add_param_group({"params": list(b.parameters())})
    with amp.autocast():
        loss = nn.functional.cross_entropy(b(torch.relu(a(x))), y)
    amp.backward(loss)
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in [*a.parameters(), *b.parameters()]]))
    amp.step(opt, zero_grad=False)
    assert amp.stats()["grad_norm"] == pytest.approx(float(expected), rel=1e-6)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in [*a.parameters(), *b.parameters()]]))
    assert float(total) == pytest.approx(1e-3, rel=1e-3)  # the new group was clipped with the rest
    opt.zero_grad()
    before = _state(a, b)
    amp.backward(nn.functional.cross_entropy(b(torch.relu(a(x))), y))
    b.weight.grad[0, 0] = float("inf")
    amp.step(opt)
    _assert_same(before, _state(a, b))
    assert amp.stats()["skipped"] == 1


@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_skip_covers_parameters_outside_the_clipped_subset(name):
    a, b = _two_part_model()
    opt = torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=1e-2, foreach=True)
    amp = MixedPrecision(name, max_grad_norm=1.0)
    x, y = _batches(1)[0]
    before = _state(a, b)
    amp.backward(nn.functional.cross_entropy(b(torch.relu(a(x))), y))
    b.bias.grad[0] = float("nan")
    amp.step(opt, parameters=a.parameters())
    _assert_same(before, _state(a, b))
    s = amp.stats()
    assert s["skipped"] == 1 and s["last_skipped"]
    assert s["grad_norm"] == s["grad_norm"]  # the clipped subset's own norm stays finite: what clipping used


@pytest.mark.parametrize("name", ["fp32", "bf16"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_infinite_norm_of_finite_gradients_is_skipped(name, fused):
    """Issue 12 (9): a norm of +inf (every gradient finite, their squares overflow), not NaN, is skipped."""
    a, b = _two_part_model()
    kw = {"fused": True} if fused else {"foreach": True}
    opt = torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=1e-2, **kw)
    amp = MixedPrecision(name, max_grad_norm=1.0)
    x, y = _batches(1)[0]
    amp.backward(nn.functional.cross_entropy(b(torch.relu(a(x))), y))
    before = _state(a, b)
    for p in [*a.parameters(), *b.parameters()]:
        p.grad.fill_(3e38)  # finite in float32
    assert all(torch.isfinite(p.grad).all() for p in a.parameters())
    amp.step(opt)
    _assert_same(before, _state(a, b))
    s = amp.stats()
    assert s["grad_norm"] == float("inf") and s["skipped"] == 1
    assert bool(amp.last_skipped) is True


def test_fp16_grad_norm_in_stats_is_the_unscaled_norm_clipping_used():
    """Issue 12 (1): in FP16, stats()['grad_norm'] equals the norm of the unscaled gradients."""
    a, b = _two_part_model()
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.0)
    amp = MixedPrecision("fp16", max_grad_norm=1e6, init_scale=2.0**10)
    x, y = _batches(1)[0]
    with amp.autocast():
        loss = nn.functional.cross_entropy(b(torch.relu(a(x))), y)
    ref_loss = loss.detach().float()
    amp.backward(loss)
    amp.step(opt, zero_grad=False)
    unscaled = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in [*a.parameters(), *b.parameters()]]))
    got = amp.stats()["grad_norm"]
    assert got == pytest.approx(float(unscaled), rel=1e-6)
    assert 1e-3 < got < 1e3 and torch.isfinite(ref_loss)  # not the 1024x scaled norm
