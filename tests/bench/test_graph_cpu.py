"""Whole-step graph capture where there are no graphs (the CPU): eager steps, never silently."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from ampkit.bench import SimpleModel
from ampkit.engine import MixedPrecision
from ampkit.engine.graph import GraphedStep, capture_blockers


def _loss(m, b):
    return F.mse_loss(m(b[0]), b[1])


def _setup(seed=0):
    torch.manual_seed(seed)
    model = SimpleModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True, capturable=True)
    g = torch.Generator().manual_seed(1)
    return model, opt, (torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g))


def test_graph_true_falls_back_on_cpu_with_the_reason():
    model, opt, batch = _setup()
    amp = MixedPrecision("fp32", max_grad_norm=1.0, graph=True)
    with pytest.warns(UserWarning, match="cpu has no graph capture.*running eager steps"):
        step = amp.graph_step(model, opt, _loss, batch)
    assert isinstance(step, GraphedStep)
    assert step.captured is False and step.mode == "eager"
    assert "cpu has no graph capture" in step.fallback_reason
    assert amp.graph_fallback_reason == step.fallback_reason
    # and it still trains, exactly like the engine's own eager loop
    ref_model, ref_opt, _ = _setup()
    ref = MixedPrecision("fp32", max_grad_norm=1.0)
    for _ in range(5):
        loss = step(batch)
        with ref.autocast():
            ref_loss = _loss(ref_model, batch)
        ref.backward(ref_loss)
        ref.step(ref_opt)
        assert torch.equal(loss, ref_loss.detach())
    assert amp.stats()["steps"] == 5


def test_graph_false_runs_eagerly_without_warning():
    model, opt, batch = _setup()
    amp = MixedPrecision("fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step = amp.graph_step(model, opt, _loss, batch)
        step(batch)
    assert step.captured is False and "graph=False" in step.fallback_reason


def test_blockers_name_the_fix(simulated_cuda):
    # A device with graphs (simulated CUDA card) lets the optimizer and accumulation checks speak.
    simulated_cuda((9, 0))
    from ampkit.device import Device
    from ampkit.device.policy import resolve_precision

    dev = Device("cuda", 0)
    if dev.graph_api() is None:
        pytest.skip("the simulated CUDA namespace has no graph API")
    prec = resolve_precision("fp32", dev)
    params = [torch.nn.Parameter(torch.zeros(2))]
    amp = MixedPrecision(prec, device=dev, set_tf32=False)
    assert "not a fused optimizer" in capture_blockers(amp, torch.optim.AdamW(params))
    assert "capturable=False" in capture_blockers(amp, torch.optim.AdamW(params, fused=True))
    assert capture_blockers(amp, torch.optim.AdamW(params, fused=True, capturable=True)) is None
    amp4 = MixedPrecision(prec, device=dev, set_tf32=False, accumulation_steps=4)
    assert "accumulation" in capture_blockers(amp4, torch.optim.AdamW(params, fused=True, capturable=True))
