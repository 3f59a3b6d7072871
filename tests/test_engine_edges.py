"""Issue 26: schedulers at the edges of real loops (stepped by hand too, reading loop state, per epoch,
chained, added groups), and the inputs that gave torch or Python tracebacks instead of one ampkit line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as L

import ampkit
from ampkit.engine import MixedPrecision
from ampkit.errors import UsageError


def _setup(fused=True, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)


def _loss(model, i, bad=False):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
    return nn.functional.mse_loss(model(x * (float("inf") if bad else 1.0)).float(), y)


# ---------------------------------------------------------------------- schedulers
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "host"])
def test_a_scheduler_also_stepped_by_hand_is_refused(fused):
    model, opt = _setup(fused)
    sched = L.StepLR(opt, step_size=2, gamma=0.5)
    amp = MixedPrecision("bf16")
    amp.backward(_loss(model, 0))
    amp.step(opt, scheduler=sched)
    sched.step()  # the loop's own scheduler.step(), kept from the torch version
    amp.backward(_loss(model, 1))
    with pytest.raises(UsageError, match=r"StepLR is given to amp.step\(scheduler=...\) and was also stepped by hand"):
        amp.step(opt, scheduler=sched)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "host"])
def test_loading_a_scheduler_state_is_not_a_hand_step(fused):
    model, opt = _setup(fused)
    sched = L.StepLR(opt, step_size=2, gamma=0.5)
    amp = MixedPrecision("bf16")
    for i in range(3):
        amp.backward(_loss(model, i))
        amp.step(opt, scheduler=sched)
    amp.sync_schedulers()
    saved = {k: (list(v) if isinstance(v, list) else v) for k, v in sched.state_dict().items()}  # as torch.load
    for i in range(3, 5):
        amp.backward(_loss(model, i))
        amp.step(opt, scheduler=sched)
    amp.sync_schedulers()
    assert sched.last_epoch == 5
    sched.load_state_dict(saved)  # back to step 3, as a resume does: a new state, not a hand step
    amp.backward(_loss(model, 5))
    amp.step(opt, scheduler=sched)
    amp.sync_schedulers()
    assert sched.last_epoch == 4


@pytest.mark.parametrize("kind", ["LambdaLR", "MultiplicativeLR", "SequentialLR"])
def test_a_lambda_that_reads_loop_state_is_refused_at_the_step_it_changes(kind):
    """With a fused optimizer the schedule is evaluated ahead: a function of a loop variable would keep the
    old rate. The engine calls the function again at every step (host only) and refuses the difference at
    the step whose rate it would have made stale, before that rate is used: a loop of a few steps that never
    calls stats() (the case a check at sync or at table extension misses) trains on no stale rate."""
    model, opt = _setup(True)
    phase = {"factor": 1.0}
    if kind == "SequentialLR":  # a user's function inside a chain, at its own step count (after the milestone)
        sched = L.SequentialLR(opt, [L.ConstantLR(opt, factor=0.5, total_iters=2),
                                     L.LambdaLR(opt, lambda step: phase["factor"])], milestones=[2])
    else:
        sched = getattr(L, kind)(opt, lambda step: phase["factor"])
    amp = MixedPrecision("bf16")
    with pytest.raises(UsageError, match=r"LR gives other learning rates now .* must depend on the step"):
        for i in range(8):  # far fewer steps than a chunk, and no stats()
            if i == 5:
                phase["factor"] = 0.9  # e.g. a loop that lowers the rate after validation
            amp.backward(_loss(model, i))
            amp.step(opt, scheduler=sched)
    assert i == 5  # the step after which the evaluated-ahead rate would have been stale


def test_a_lambda_that_reads_loop_state_is_refused_at_a_sync_too():
    """A change of the loop state and a sync before the next step: the sync's own check refuses it."""
    model, opt = _setup(True)
    phase = {"factor": 1.0}
    sched = L.LambdaLR(opt, lambda step: phase["factor"])
    amp = MixedPrecision("bf16")
    for i in range(3):
        amp.backward(_loss(model, i))
        amp.step(opt, scheduler=sched)
    phase["factor"] = 0.1
    with pytest.raises(UsageError, match=r"LambdaLR gives other learning rates now .* must depend on the step"):
        amp.stats()


def test_a_lambda_of_the_step_only_passes_the_check():
    model, opt = _setup(True)
    sched = L.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    amp = MixedPrecision("bf16")
    for i in range(5):
        amp.backward(_loss(model, i))
        amp.step(opt, scheduler=sched)
    amp.stats()
    assert sched.last_epoch == 5 and sched.get_last_lr()[0] == pytest.approx(1e-2 / 6)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "host"])
def test_a_per_epoch_scheduler_passed_on_an_epochs_last_batch_is_refused(fused):
    """Passed only on the last batch, a skip there would hold the rate for a whole epoch: refused at once."""
    model, opt = _setup(fused)
    sched = L.StepLR(opt, step_size=1, gamma=0.5)
    amp = MixedPrecision("bf16")
    with pytest.raises(UsageError, match=r"for the first time after 3 steps of its optimizer.*per-epoch"):
        for i in range(4):
            amp.backward(_loss(model, i, bad=i == 3))
            amp.step(opt, scheduler=sched if i == 3 else None)


def test_a_scheduler_left_out_of_some_steps_is_refused():
    model, opt = _setup(True)
    sched = L.StepLR(opt, step_size=1, gamma=0.5)
    amp = MixedPrecision("bf16")
    with pytest.raises(UsageError, match=r"at step 3 of its optimizer and before at step 1, not in between"):
        for i in range(3):
            amp.backward(_loss(model, i))
            amp.step(opt, scheduler=sched if i != 1 else None)


def test_chained_scheduler_with_a_fused_optimizer_follows_the_host_schedule():
    rates = {}
    for fused in (True, False):
        model, opt = _setup(fused)
        sched = L.ChainedScheduler([L.StepLR(opt, step_size=2, gamma=0.5), L.ExponentialLR(opt, gamma=0.9)])
        amp = MixedPrecision("bf16")
        for i in range(6):
            amp.backward(_loss(model, i, bad=i == 2))  # step 2 is skipped: the schedule holds
            amp.step(opt, scheduler=sched)
        amp.sync_schedulers()
        rates[fused] = [float(g["lr"]) for g in opt.param_groups]
    assert rates[True] == pytest.approx(rates[False], rel=1e-12)
    assert rates[False][0] == pytest.approx(1e-2 * 0.5**2 * 0.9**5)


def test_a_device_schedule_is_rebuilt_after_add_param_group():
    """A group added after the first steps follows the schedule, as it does with a host-stepped optimizer."""
    rates = {}
    for fused in (True, False):
        torch.manual_seed(0)
        first, second = nn.Linear(4, 1), nn.Linear(4, 1)
        opt = torch.optim.AdamW(first.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)
        sched = L.ExponentialLR(opt, gamma=0.5)  # chainable: it steps whatever groups there are
        amp = MixedPrecision("bf16")
        x = torch.ones(2, 4)
        for i in range(5):
            if i == 2:
                opt.add_param_group({"params": second.parameters(), "lr": 1e-3, "initial_lr": 1e-3})
            amp.backward(first(x).sum() + second(x).sum())
            amp.step(opt, scheduler=sched)
        rates[fused] = [float(g["lr"]) for g in opt.param_groups]
    assert rates[False] == pytest.approx([1e-2 * 0.5**5, 1e-3 * 0.5**3])
    assert rates[True] == pytest.approx(rates[False], rel=1e-12)


# ---------------------------------------------------------------------- one line, not a traceback
@pytest.mark.parametrize("precision,clip", [("fp16", None), ("bf16", None), ("fp16", 0.01)])
def test_sparse_gradients_step_like_torch(precision, clip):
    """Embedding(sparse=True) + SparseAdam: the norm of the stored values, clipping by hand (torch's
    clip_grad_norm_ has no sparse kernel), the update exactly torch's for the same true gradient."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4, sparse=True)
    ref = nn.Embedding(10, 4, sparse=True)
    ref.load_state_dict(emb.state_dict())
    opt, opt_ref = torch.optim.SparseAdam(emb.parameters(), lr=0.1), torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    amp = MixedPrecision(precision, max_grad_norm=clip)
    ids = torch.tensor([1, 2, 2, 7])
    amp.backward(emb(ids).pow(2).sum())
    amp.step(opt)
    ref(ids).pow(2).sum().backward()
    norm = ref.weight.grad.coalesce().values().norm()
    if clip is not None:
        ref.weight.grad.mul_(min(1.0, clip / (float(norm) + 1e-6)))
    opt_ref.step()
    assert amp.stats()["grad_norm"] == pytest.approx(float(norm), rel=1e-6)
    assert torch.allclose(emb.weight, ref.weight, rtol=1e-6, atol=1e-7)


def test_unscale_by_hand_then_amp_step_is_torchs_recipe():
    """Per-parameter clipping after amp.scaler.unscale_(opt), then amp.step: unscaled once, the same
    weights as torch's unscale_ -> clip -> scaler.step -> update."""
    model, opt = _setup(True)
    ref, opt_ref = _setup(True)
    amp = MixedPrecision("fp16")
    scaler = torch.amp.GradScaler("cpu")
    for i in range(3):
        amp.backward(_loss(model, i))
        amp.scaler.unscale_(opt)
        for p in model.parameters():
            torch.nn.utils.clip_grad_norm_([p], 0.05)
        amp.step(opt)
        scaler.scale(_loss(ref, i)).backward()
        scaler.unscale_(opt_ref)
        for p in ref.parameters():
            torch.nn.utils.clip_grad_norm_([p], 0.05)
        scaler.step(opt_ref)
        scaler.update()
        opt_ref.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))


@pytest.mark.parametrize("bad", [5, [5], "w"])
def test_parameters_must_be_tensors(bad):
    model, opt = _setup(True)
    amp = MixedPrecision("bf16")
    amp.backward(_loss(model, 0))
    with pytest.raises(UsageError, match=r"parameters= takes the tensors to clip") as info:
        amp.step(opt, parameters=bad)
    assert "\n" not in str(info.value)


def test_one_tensor_as_parameters_is_clipped():
    model, opt = _setup(True)
    amp = MixedPrecision("fp32", max_grad_norm=1e-3)
    amp.backward(_loss(model, 0))
    amp.step(opt, parameters=model[0].weight, zero_grad=False)
    assert float(model[0].weight.grad.norm()) == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("models", [lambda G, D: [G, D], lambda G, D: (G, D), lambda G, D: {"G": G, "D": D}])
def test_save_checkpoint_of_several_models_says_to_use_a_module_dict(tmp_path, models):
    G, D = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(UsageError, match=r"model= takes one nn.Module, got a \w+: .*nn.ModuleDict"):
        ampkit.save_checkpoint(tmp_path / "c.pt", model=models(G, D), optimizer=None, step=1)
    assert not (tmp_path / "c.pt").exists()
    both = nn.ModuleDict({"G": G, "D": D})
    path = ampkit.save_checkpoint(tmp_path / "c.pt", model=both, optimizer=None, step=1)
    with pytest.raises(UsageError, match="model= takes one nn.Module"):
        ampkit.restore(path, model=[G, D])
    ampkit.restore(path, model=both)


@pytest.mark.parametrize("device", [torch.device("cpu"), "cpu"])
def test_resolve_precision_takes_a_torch_device(device):
    from ampkit.device.policy import resolve_precision

    assert resolve_precision("fp32", device).device == ampkit.Device("cpu")
    with pytest.raises(UsageError, match="device takes"):
        resolve_precision("fp32", 3)
