"""Bad arguments and misuse get one-line ampkit errors that say what to do, never torch internals;
the skip limit halts a loop that never reads stats(); warnings for weights without master copies."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from ampkit.engine.config import AmpConfig
from ampkit.device import Device
from ampkit.engine import MixedPrecision
from ampkit.errors import AmpkitError, TrainingHalted, UsageError


def _setup(name="fp16", **kw):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), MixedPrecision(name, **kw)


def _loss(model, bad=1.0):
    return model(torch.ones(3, 4) * bad).pow(2).mean()


@pytest.mark.parametrize("kw,match", [
    ({"max_grad_norm": math.nan}, "max_grad_norm"), ({"max_grad_norm": math.inf}, "max_grad_norm"),
    ({"max_grad_norm": -1.0}, "max_grad_norm"), ({"init_scale": 0.0}, "init_scale"),
    ({"min_scale": -1.0}, "min_scale"), ({"growth_interval": 0}, "growth_interval"),
    ({"accumulation_steps": 2.5}, "accumulation_steps"), ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.0}, "backoff_factor"), ({"max_consecutive_skips": 0}, "max_consecutive_skips"),
    ({"bogus": 1}, "unknown engine setting"), ({"config": 3}, "config takes"),
    ({"device": 3}, "device takes"), ({"config": "nope"}, "unknown engine preset"),
])
def test_bad_arguments_are_usage_errors_up_front(kw, match):
    with pytest.raises(UsageError, match=match) as info:
        MixedPrecision("fp16", **kw)
    assert "\n" not in str(info.value)


def test_max_grad_norm_zero_means_no_clipping_as_in_the_cli():
    model, opt, amp = _setup("fp32", max_grad_norm=0)
    assert amp.max_grad_norm is None
    amp.backward(_loss(model, 100.0))
    amp.step(opt, zero_grad=False)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert float(norm) > 1.0 and amp.stats()["grad_norm"] == pytest.approx(float(norm))


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), Device("cpu")], ids=["str", "torch", "Device"])
def test_device_forms(device):
    amp = MixedPrecision("fp32", device=device)
    assert amp.device == Device("cpu")


def test_config_and_overrides():
    amp = MixedPrecision("bf16", config=AmpConfig.preset("fp16-safe"), max_grad_norm=0.5)
    assert amp.config.init_scale == 2.0**10 and amp.max_grad_norm == 0.5
    assert MixedPrecision("bf16", config="torch").min_scale == 0.0
    assert amp.state_dict()["config"]["max_grad_norm"] == 0.5


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_step_before_any_backward(name):
    model, opt, amp = _setup(name)
    with pytest.raises(AmpkitError, match="before any amp.backward.*not loss.backward"):
        amp.step(opt)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_loss_backward_instead_of_amp_backward(name):
    model, opt, amp = _setup(name)
    amp.backward(_loss(model))
    amp.step(opt)
    _loss(model).backward()  # the mistake: no scaling, no accumulation division
    with pytest.raises(AmpkitError, match="twice on one amp.backward.*not loss.backward"):
        amp.step(opt)


def test_backward_of_a_dict_or_a_detached_loss():
    model, opt, amp = _setup()
    with pytest.raises(UsageError, match="takes the loss tensor, got dict with keys \\['logits', 'loss'\\]"):
        amp.backward({"loss": _loss(model), "logits": None})
    with pytest.raises(UsageError, match="does not require grad"):
        amp.backward(_loss(model).detach())


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_step_on_an_optimizer_without_gradients(name):
    model, opt, amp = _setup(name)
    other = nn.Linear(4, 2)
    amp.backward(other(torch.ones(1, 4)).sum())  # a loss that does not touch the optimizer's parameters
    with pytest.raises(AmpkitError, match="no parameter of AdamW has a gradient"):
        amp.step(opt)


def test_closure_optimizers_and_non_optimizers_are_refused():
    model, _, amp = _setup("fp32")
    amp.backward(_loss(model))
    with pytest.raises(UsageError, match="LBFGS.*closure"):
        amp.step(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(UsageError, match="takes torch optimizers"):
        amp.step(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match="given twice"):
        amp.step(opt, opt)
    with pytest.raises(UsageError, match="needs the optimizer"):
        amp.step()


def test_train_step_needs_one_micro_batch_per_accumulation_step():
    model, opt, amp = _setup("fp32", accumulation_steps=2)
    with pytest.raises(UsageError, match="list of 2 micro-batch"):
        amp.train_step(model, lambda m, b: _loss(m), [torch.ones(1)], opt)
    with pytest.raises(UsageError, match="got a single batch"):
        amp.train_step(model, lambda m, b: _loss(m), torch.ones(2, 4), opt)


@pytest.mark.parametrize("name", ["fp32", "fp16"])
def test_skip_limit_halts_a_loop_that_never_reads_stats(name):
    model, opt, amp = _setup(name, max_consecutive_skips=3, skip_check_every=2, min_scale=0.0)
    with pytest.raises(TrainingHalted, match="in a row had non-finite gradients.*ampkit diagnose"):
        for _ in range(20):
            amp.backward(_loss(model, math.inf))
            amp.step(opt)
    assert amp.steps == 4  # the limit (3) is reached at step 3, read at the check of step 4


def test_skip_check_is_one_host_read_every_n_steps(monkeypatch):
    model, opt, amp = _setup("bf16", skip_check_every=5)
    reads = []
    real = MixedPrecision._halt_if_limit
    monkeypatch.setattr(MixedPrecision, "_halt_if_limit", lambda self, *a: reads.append(self.steps) or real(self, *a))
    for _ in range(12):
        amp.backward(_loss(model))
        amp.step(opt)
    assert reads == [5, 10]
    assert MixedPrecision("bf16", max_consecutive_skips=None).config.check_every is None


@pytest.mark.parametrize("name,dtype,label", [("bf16", torch.bfloat16, "BF16"), ("fp32", torch.float16, "FP16"),
                                              ("fp32", torch.bfloat16, "BF16")])
def test_low_precision_weights_warn(name, dtype, label):
    model = nn.Linear(4, 2).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision(name)
    amp.backward(model(torch.ones(1, 4, dtype=dtype)).float().sum())
    with pytest.warns(UserWarning, match=f"2 parameter\\(s\\) are {label} under {name}.*no FP32 master copy"):
        amp.step(opt)


def test_fp32_weights_do_not_warn_and_new_groups_are_checked():
    model, opt, amp = _setup("bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.backward(_loss(model))
        amp.step(opt)
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]})
    amp.backward(_loss(model))
    with pytest.warns(UserWarning, match="1 parameter\\(s\\) are BF16"):
        amp.step(opt)


@pytest.mark.parametrize("value,name", [(torch.bfloat16, "bf16"), ("BF16", "bf16"), (torch.float16, "fp16"),
                                        ("Fp32", "fp32")])
def test_precision_forms(value, name):
    assert MixedPrecision(value).precision.name == name
