"""ampkit.compat: the one place that touches private or version-dependent torch APIs."""

from __future__ import annotations

import torch

from ampkit import compat


def test_version_gate_parses_release_strings():
    assert compat._version("2.5.1+cu121") == (2, 5)
    assert compat._version("2.13.0a0+git1234") == (2, 13)
    assert compat._version("garbage") == (0, 0)
    assert compat.TORCH_VERSION >= (2, 5)
    assert compat.HAS_GET_TOTAL_NORM is hasattr(torch.nn.utils, "get_total_norm")


def test_scaler_internals_round_trip():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    assert compat.scaler_tensors(scaler) == (None, None)
    assert compat.scaler_init_values(scaler) == (8.0, 0)
    scale, tracker = torch.full((), 8.0), torch.zeros((), dtype=torch.int32)
    compat.adopt_scaler_tensors(scaler, scale, tracker)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    (scaler.scale(p.sum()) * float("inf")).backward()
    scaler.unscale_(opt)
    assert [float(f) for f in compat.found_inf_flags(scaler, opt)] == [1.0]
    scaler.step(opt)
    scaler.update()
    assert float(scale) == 4.0  # torch updated the adopted tensor in place
    compat.clamp_scale_(scaler, 6.0)
    assert scaler.get_scale() == 6.0
    scaler.unscale_(opt)
    compat.forget_unscale(scaler)
    assert not scaler._per_optimizer_states


def test_fused_step_skips_on_the_device_and_norms():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    assert compat.supports_found_inf(opt) and not compat.supports_found_inf(torch.optim.AdamW([p], foreach=True))
    p.grad = torch.ones(3)
    compat.fused_step(opt, torch.ones(()))
    assert torch.equal(p.detach(), torch.ones(3)) and not hasattr(opt, "found_inf")
    compat.fused_step(opt, torch.zeros(()))
    assert not torch.equal(p.detach(), torch.ones(3))
    grads = [torch.full((2,), 3.0), torch.full((1,), 4.0)]
    assert float(compat.total_norm(grads)) == float(torch.linalg.vector_norm(torch.tensor([3.0, 3.0, 4.0])))
    a, b = torch.zeros(2), torch.zeros(1)
    compat.foreach_add_([a, b], [torch.ones(2), torch.ones(1)])
    compat.foreach_copy_([a], [torch.full((2,), 5.0)])
    assert a.tolist() == [5.0, 5.0] and b.tolist() == [1.0]
