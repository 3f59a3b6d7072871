"""state_dict / load_state_dict after skipped steps and a backed-off scale, and the one eager step
(``train_step``: micro-batches, no_sync, backward, step) against the hand-written engine loop."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from ampkit.engine import MixedPrecision


def _setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


def _batch(i, bad=False):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(3, 4, generator=g)
    return (x * float("inf") if bad else x), torch.randn(3, 2, generator=g)


def _loss(model, batch):
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def test_skip_counters_scale_and_growth_tracker_survive_the_round_trip():
    """Issue 12 (2) and (3): after skipped steps and a back-off, a fresh engine resumes every counter."""
    model, opt = _setup()
    amp = MixedPrecision("fp16", init_scale=2.0**10, growth_interval=3, min_scale=0.0)
    for i, bad in enumerate([False, True, True, False, False]):
        amp.train_step(model, _loss, [_batch(i, bad)], opt)
    before = amp.stats()
    assert before["skipped"] == 2 and before["scale"] == 2.0**8 and before["consecutive_skips"] == 0
    amp.backward(_loss(model, _batch(9, True)))  # one more skip: consecutive 1, scale 2**7
    amp.step(opt)
    state = amp.state_dict()
    assert state["scaler"]["scale"] == 2.0**7 and state["scaler"]["_growth_tracker"] == 0
    fresh = MixedPrecision("fp16", init_scale=2.0**10, growth_interval=3, min_scale=0.0)
    assert fresh.load_state_dict(state) == []
    got = fresh.stats()
    assert (got["skipped"], got["consecutive_skips"], got["scale"], got["steps"]) == (3, 1, 2.0**7, 6)
    # the growth tracker came along: two good steps grow nothing yet, the third doubles (interval 3)
    for i in range(3):
        fresh.train_step(model, _loss, [_batch(20 + i)], opt)
        assert fresh.stats()["scale"] == (2.0**8 if i == 2 else 2.0**7)
    assert fresh.stats()["consecutive_skips"] == 0 and fresh.stats()["skipped"] == 3


def test_growth_tracker_mid_interval_survives():
    model, opt = _setup()
    amp = MixedPrecision("fp16", init_scale=2.0**10, growth_interval=4)
    for i in range(3):
        amp.train_step(model, _loss, [_batch(i)], opt)
    state = amp.state_dict()
    assert state["scaler"]["_growth_tracker"] == 3
    fresh = MixedPrecision("fp16", init_scale=2.0**10, growth_interval=4)
    fresh.load_state_dict(state)
    fresh.train_step(model, _loss, [_batch(5)], opt)
    assert fresh.stats()["scale"] == 2.0**11  # the 4th good step grows it: the tracker was not reset


def test_mid_window_state_says_so_and_resumes_the_window():
    model, opt = _setup()
    amp = MixedPrecision("fp32", accumulation_steps=3)
    for i in range(4):
        amp.backward(_loss(model, _batch(i)))
        amp.step(opt)
    assert amp.accumulation_pending == 1
    state = amp.state_dict()
    assert state["window"] == 1 and state["micro"] == 4
    fresh = MixedPrecision("fp32", accumulation_steps=3)
    fresh.load_state_dict(state)
    assert fresh.accumulation_pending == 1 and fresh.accumulating
    stepped = []
    for i in range(2):
        fresh.backward(_loss(model, _batch(i)))
        stepped.append(fresh.step(opt))
    assert stepped == [False, True]


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_train_step_is_the_hand_written_engine_loop(name):
    ref_model, ref_opt = _setup()
    ref = MixedPrecision(name, max_grad_norm=1.0, accumulation_steps=2, growth_interval=2, init_scale=2.0**8)
    model, opt = _setup()
    amp = MixedPrecision(name, max_grad_norm=1.0, accumulation_steps=2, growth_interval=2, init_scale=2.0**8)
    for step in range(5):
        batches = [_batch(2 * step + k, bad=(step == 2 and k == 1)) for k in range(2)]
        ref_losses = []
        for b in batches:
            with ref.autocast():
                loss = _loss(ref_model, b)
            ref.backward(loss)
            ref.step(ref_opt)
            ref_losses.append(loss.detach())
        losses = amp.train_step(model, _loss, batches, opt)
        torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=0, atol=0, equal_nan=True)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert amp.stats() == ref.stats()


class _SyncCounting(nn.Module):
    """A DDP-like wrapper: records which backward passes ran under no_sync."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.in_no_sync = False
        self.log = []
        self.backward_log = []  # DDP reduces gradients in backward hooks: no_sync must cover the backward
        next(inner.parameters()).register_hook(lambda g: self.backward_log.append(self.in_no_sync))

    def forward(self, x):
        self.log.append(self.in_no_sync)
        return self.inner(x)

    @contextlib.contextmanager
    def no_sync(self):
        self.in_no_sync = True
        try:
            yield
        finally:
            self.in_no_sync = False


def test_train_step_skips_gradient_sync_on_all_but_the_last_micro_batch():
    model, opt = _setup()
    wrapped = _SyncCounting(model)
    amp = MixedPrecision("fp32", accumulation_steps=3)
    for step in range(2):
        amp.train_step(wrapped, _loss, [_batch(3 * step + k) for k in range(3)], opt)
    assert wrapped.log == [True, True, False, True, True, False]
    assert wrapped.backward_log == [True, True, False, True, True, False]
    assert amp.steps == 2


def test_fp32_modules_attach_detach_and_state():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    amp = MixedPrecision("bf16", fp32_modules="preset:norm")
    seen = {}
    model[1].register_forward_hook(lambda m, i, o: seen.update(dtype=o.dtype))
    regions = amp.attach(model)
    assert regions is amp.fp32_regions and regions.names == ("1",)
    with amp.autocast():
        model(torch.randn(3, 4))
    assert seen["dtype"] == torch.float32
    amp.detach()
    assert amp.fp32_regions is None
    with amp.autocast():
        model(torch.randn(3, 4))
    assert seen["dtype"] == torch.bfloat16  # hooks gone
    state = amp.state_dict()
    assert state["fp32_modules"] == ["preset:norm"]
    assert MixedPrecision("bf16", fp32_modules="preset:norm").load_state_dict(state) == []
    with pytest.warns(UserWarning, match="kept \\['preset:norm'\\] in FP32"):
        MixedPrecision("bf16").load_state_dict(state)
    assert MixedPrecision("bf16").attach(model) is None  # nothing to keep in FP32


@pytest.mark.parametrize("name,scale", [("fp16", 2.0**16), ("bf16", 1.0)])
def test_stats_before_any_step(name, scale):
    assert MixedPrecision(name).stats() == {"steps": 0, "skipped": 0, "consecutive_skips": 0, "scale": scale,
                                            "grad_norm": None, "last_skipped": False}


def test_load_state_of_an_older_format_without_micro_or_window():
    amp = MixedPrecision("fp32", accumulation_steps=2)
    assert amp.load_state_dict({"precision": "fp32", "steps": 3, "scaler": None}) == []
    assert amp.steps == 3 and amp.state_dict()["micro"] == 6 and amp.accumulation_pending == 0
