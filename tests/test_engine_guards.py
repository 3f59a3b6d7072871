"""Issue 26, the engine half: loops that trained silently wrong now train right or stop with one ampkit line.

Hand steps under FP16, LBFGS closures, NaN learning rates, nanoGPT-style accumulation, flush, fp32_modules
without attach, parameters no optimizer steps, and a closed engine."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from ampkit.engine import MixedPrecision
from ampkit.errors import AmpkitError, UsageError


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def _loss(model, i):
    x, y = _batch(i)
    return nn.functional.mse_loss(model(x).float(), y)


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------------- hand steps under FP16
def test_a_hand_step_on_scaled_gradients_is_refused_before_it_updates():
    """A GAN's G stepped with opt_g.step() instead of amp.step(opt_g): 65536x too large an update."""
    D, G = _net(0), _net(1)
    opt_d = torch.optim.AdamW(D.parameters(), lr=1e-3, fused=True)
    opt_g = torch.optim.SGD(G.parameters(), lr=1e-3)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(D, 0))
    amp.step(opt_d)
    amp.backward(_loss(G, 1))
    before = _weights(G)
    with pytest.raises(AmpkitError, match=r"SGD.step\(\) was called by hand .* amp.step\(optimizer\)") as info:
        opt_g.step()
    assert "\n" not in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, G.parameters()))  # refused before the update


def test_torch_recipe_unscale_then_hand_step_and_other_models_stay_allowed():
    model, other = _net(0), _net(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_other = torch.optim.SGD(other.parameters(), lr=0.1)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(model, 0))
    amp.scaler.unscale_(opt)  # torch's recipe: true gradients, the skip is then the caller's
    expected = [p.detach() - 0.1 * p.grad for p in model.parameters()]
    opt.step()
    assert all(torch.allclose(a, b) for a, b in zip(expected, model.parameters()))
    _loss(other, 1).backward()  # a model trained on its own plain loss in the same loop
    opt_other.step()


def test_bf16_hand_steps_are_not_judged():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("bf16")
    amp.backward(_loss(model, 0))
    opt.step()  # no loss scale: the gradients are true ones


def test_an_engine_left_behind_does_not_judge_a_later_loop():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(model, 0))
    amp.step(opt)
    amp.stats()  # the scale update: the scaler no longer holds the optimizer as unscaled
    for i in range(2):  # the same model, trained on by hand in FP32 afterwards
        opt.zero_grad()
        _loss(model, i).backward()
        opt.step()
    assert amp.steps == 1


def test_parameters_that_no_optimizer_steps_are_warned_about():
    """Two optimizers on one backward, only one passed to amp.step: the other's gradients accumulate."""
    enc, head = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_enc = torch.optim.AdamW(enc.parameters(), lr=1e-3, fused=True)
    torch.optim.AdamW(head.parameters(), lr=1e-3, fused=True)  # made, never stepped
    amp = MixedPrecision("bf16")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(3):
            x, y = _batch(i)
            amp.backward(nn.functional.mse_loss(head(torch.tanh(enc(x))), y))
            amp.step(opt_enc)
    found = [w for w in seen if "no optimizer stepped them" in str(w.message)]
    assert len(found) == 1 and "2 parameter(s)" in str(found[0].message)


def test_parameters_all_stepped_get_no_warning():
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    amp = MixedPrecision("bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(3):
            amp.backward(_loss(model, i))
            amp.step(opt)


# ---------------------------------------------------------------------- LBFGS
def test_amp_backward_inside_an_lbfgs_closure_under_fp16_is_refused():
    model = _net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    amp = MixedPrecision("fp16")

    def closure():
        opt.zero_grad()
        with amp.autocast():
            loss = _loss(model, 0)
        amp.backward(loss)
        return loss

    with pytest.raises(UsageError, match="inside an optimizer closure \\(LBFGS\\) under FP16"):
        opt.step(closure)
    opt.step(closure=lambda: float(_loss(model, 0).backward() or 0))  # the hook's wrapper did not stay


def test_amp_backward_inside_an_lbfgs_closure_under_bf16_gives_lbfgs_true_gradients():
    model, ref = _net(), _net()
    amp = MixedPrecision("bf16")
    for m, use_amp in ((model, True), (ref, False)):
        opt = torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=3)

        def closure(m=m, opt=opt, use_amp=use_amp):
            opt.zero_grad()
            with amp.autocast():
                loss = _loss(m, 0)
            amp.backward(loss) if use_amp else loss.backward()
            return loss

        opt.step(closure)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))


# ---------------------------------------------------------------------- learning rates
@pytest.mark.parametrize("fused", [True, False])
def test_a_nan_learning_rate_is_refused_at_its_step(fused):
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(model, 0))
    amp.step(opt)
    opt.param_groups[0]["lr"] = float("nan")
    amp.backward(_loss(model, 1))
    before = _weights(model)
    with pytest.raises(AmpkitError, match=r"learning rate of AdamW param group 0 to nan"):
        amp.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("fused", [True, False], ids=["device-table", "host"])
def test_a_scheduler_that_makes_a_nan_rate_is_named_at_that_step(fused):
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: float("nan") if s >= 3 else 1.0)
    amp = MixedPrecision("fp16")
    done = 0
    with pytest.raises(AmpkitError, match=r"LambdaLR sets? .*nan") as info:
        for i in range(10):
            amp.backward(_loss(model, i))
            amp.step(opt, scheduler=sched)
            done += 1
    assert done == 2, info.value  # the step after which the scheduler's rate became NaN
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------- accumulation
def _run_nanogpt(accum, calls_per_step, steps, flush_last=False):
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp32", accumulation_steps=accum)
    moved, i = [], 0
    for _ in range(steps):
        before = _weights(model)
        for _ in range(calls_per_step):
            amp.backward(_loss(model, i))
            i += 1
        amp.step(opt)
        moved.append(not all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
    return model, moved


def test_nanogpt_structure_steps_every_amp_step_with_the_mean_gradient():
    """accumulation_steps=4 and 4 amp.backward calls per amp.step (nanoGPT's loop): every step moves
    the weights, by the mean gradient of its 4 micro-batches, as the engine's own accumulation does."""
    model, moved = _run_nanogpt(4, 4, 3)
    assert moved == [True, True, True]
    ref = _net()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    amp = MixedPrecision("fp32", accumulation_steps=4)
    for i in range(12):  # one amp.step per backward: every 4th steps
        amp.backward(_loss(ref, i))
        amp.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))


def test_other_counts_of_backward_calls_per_step_are_refused():
    with pytest.raises(AmpkitError, match=r"amp.step after 3 amp.backward calls with accumulation_steps=4"):
        _run_nanogpt(4, 3, 1)


def test_flush_steps_a_partial_window_as_the_mean_of_its_micro_batches():
    """The last 3 micro-batches of an epoch with accumulation_steps=4, flushed, step as a window of 3."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16", accumulation_steps=4)
    results = []
    for i in range(3):
        amp.backward(_loss(model, i))
        results.append(amp.step(opt, flush=i == 2))
    assert results == [False, False, True] and amp.accumulation_pending == 0
    ref = _net()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    amp3 = MixedPrecision("fp16", accumulation_steps=3)
    for i in range(3):
        amp3.backward(_loss(ref, i))
        amp3.step(opt_ref)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(model.parameters(), ref.parameters()))


def test_optimizers_at_different_points_of_their_windows_are_refused():
    a, b = _net(0), _net(1)
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b))
    amp = MixedPrecision("fp32", accumulation_steps=2)
    amp.backward(_loss(a, 0))
    amp.step(opt_a)  # opt_a: 1 of 2
    amp.backward(_loss(a, 1) + _loss(b, 1))
    with pytest.raises(AmpkitError, match="different points of their accumulation windows"):
        amp.step(opt_a, opt_b)  # opt_a would complete, opt_b would be at 1 of 2


# ---------------------------------------------------------------------- fp32_modules, close
def test_fp32_modules_without_attach_is_refused_at_the_first_step():
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    before = [p.detach().clone() for p in model.parameters()]
    amp = MixedPrecision("bf16", fp32_modules=["2"])
    amp.backward(_loss(model, 0))
    with pytest.raises(UsageError, match=r"^fp32_modules \['2'\] is set but amp.attach\(model\) was not called, so "
                                         r"no module would be kept in FP32: call amp.attach\(model\) once"):
        amp.step(opt)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # no step was taken
    fp32 = MixedPrecision("fp32", fp32_modules=["2"])  # no autocast: nothing runs in low precision anyway
    fp32.backward(_loss(model, 0))
    fp32.step(opt)
    attached = MixedPrecision("bf16", fp32_modules=["2"])
    attached.attach(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attached.backward(_loss(model, 0))
        attached.step(opt)


def test_a_closed_engine_refuses_to_train_and_drops_its_hook():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(model, 0))
    amp.step(opt)
    amp.backward(_loss(model, 1))
    amp.close()
    with pytest.raises(UsageError, match=r"amp.step after amp.close\(\)"):
        amp.step(opt)
    with pytest.raises(UsageError, match=r"amp.backward after amp.close\(\)"):
        amp.backward(_loss(model, 2))
    opt.step()  # the hook is gone: a closed engine judges nothing
    assert amp.stats()["steps"] == 1 and amp.state_dict()["steps"] == 1


def _two_groups(fused):
    model = _net()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    return model, torch.optim.AdamW([{"params": first}, {"params": second}], lr=1e-3, fused=fused)


@pytest.mark.parametrize("fused", [True, False])
def test_a_nan_learning_rate_in_a_later_param_group_is_refused(fused):
    """Every param group is checked, not only the first (issue 47: a guard of group 0 wrote NaN weights)."""
    model, opt = _two_groups(fused)
    amp = MixedPrecision("fp16")
    amp.backward(_loss(model, 0))
    amp.step(opt)
    opt.param_groups[1]["lr"] = float("nan")
    amp.backward(_loss(model, 1))
    before = _weights(model)
    with pytest.raises(AmpkitError, match=r"learning rate of AdamW param group 1 to nan"):
        amp.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("fused", [True, False], ids=["device-table", "host"])
def test_a_scheduler_nan_in_a_later_param_group_is_named(fused):
    model, opt = _two_groups(fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: float("nan") if s >= 3 else 1.0])
    amp = MixedPrecision("fp16")
    with pytest.raises(AmpkitError, match=r"param group 1 to nan"):
        for i in range(10):
            amp.backward(_loss(model, i))
            amp.step(opt, scheduler=sched)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_infinite_learning_rate_is_refused():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16")
    opt.param_groups[0]["lr"] = float("inf")
    amp.backward(_loss(model, 0))
    with pytest.raises(AmpkitError, match=r"learning rate of SGD param group 0 to inf"):
        amp.step(opt)
