"""The engine against a hand-written torch loop, and its skip / floor / limit / accumulation behaviour."""

import pytest
import torch
from torch import nn

from ampkit.device import Device
from ampkit.engine import MixedPrecision, is_fused
from ampkit.errors import AmpkitError, TrainingHalted
from ampkit.device.policy import resolve_precision

CPU = Device("cpu")


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def _data(n_steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n_steps)]


def _opt(model, fused):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, **({"fused": True} if fused else {"foreach": True}))


def _hand_loop(name, fused, data):
    """The lesson's loop, corrected: scaler only for fp16, unscale before clipping."""
    model = _model()
    opt = _opt(model, fused)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    scaler = torch.amp.GradScaler("cpu", enabled=name == "fp16")
    losses = []
    for x, y in data:
        with torch.autocast("cpu", dtype=dtype, enabled=name != "fp32"):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model


def _engine_loop(name, fused, data, **kw):
    model = _model()
    opt = _opt(model, fused)
    amp = MixedPrecision(resolve_precision(name, CPU), max_grad_norm=1.0, **kw)
    losses = []
    for x, y in data:
        with amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        amp.backward(loss)
        amp.step(opt)
        losses.append(loss.item())
    return losses, model, amp, opt


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_identical_to_hand_written_loop(name, fused):
    data = _data(12)
    ref, ref_model = _hand_loop(name, fused, data)
    got, model, amp, opt = _engine_loop(name, fused, data)
    assert got == ref  # bit-identical, step by step
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert is_fused(opt) is fused
    assert amp.uses_host_sync(opt) is (not fused)


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: {kk: (vv.clone() if torch.is_tensor(vv) else vv) for kk, vv in v.items()} for k, v in opt.state.items()}
    return params, state


@pytest.mark.parametrize("bad", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_nonfinite_step_is_skipped_state_unchanged(name, fused, bad):
    data = _data(4)
    _, model, amp, opt = _engine_loop(name, fused, data)
    params, state = _snapshot(model, opt)
    scale_before = amp.stats()["scale"]
    x, y = data[0]
    with amp.autocast():
        loss = nn.functional.cross_entropy(model(x * bad), y)  # a non-finite loss: no crash
    amp.backward(loss)
    assert amp.step(opt) is True
    for a, b in zip(params, model.parameters()):
        assert torch.equal(a, b)
    for k in state:
        for kk in state[k]:
            assert torch.equal(torch.as_tensor(state[k][kk]), torch.as_tensor(opt.state[k][kk])), kk
    s = amp.stats()
    assert s["skipped"] == 1 and s["last_skipped"] and s["consecutive_skips"] == 1
    if name == "fp16":
        assert s["scale"] == scale_before * 0.5  # backs off as torch does
    # and training continues normally afterwards
    with amp.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    amp.backward(loss)
    amp.step(opt)
    assert amp.stats()["consecutive_skips"] == 0
    assert not all(torch.equal(a, b) for a, b in zip(params, model.parameters()))


def test_scale_floor_and_skip_limit():
    model = _model()
    opt = _opt(model, True)
    amp = MixedPrecision(resolve_precision("fp16", CPU), max_grad_norm=1.0, init_scale=2.0**4, min_scale=0.5,
                         max_consecutive_skips=8)
    x, y = _data(1)[0]
    for _ in range(7):
        with amp.autocast():
            loss = nn.functional.cross_entropy(model(x * float("inf")), y)
        amp.backward(loss)
        amp.step(opt)
    s = amp.stats()
    assert s["scale"] == 0.5  # 16 -> 8 -> 4 -> 2 -> 1 -> 0.5 -> floor
    assert s["consecutive_skips"] == 7
    with amp.autocast():
        loss = nn.functional.cross_entropy(model(x * float("inf")), y)
    amp.backward(loss)
    amp.step(opt)
    with pytest.raises(TrainingHalted, match="ampkit diagnose"):
        amp.stats()


def test_accumulation_equivalent_to_big_batch():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
    big = _model()
    opt_b = torch.optim.SGD(big.parameters(), lr=0.1)
    amp_b = MixedPrecision(resolve_precision("fp32", CPU), max_grad_norm=1.0)
    amp_b.backward(nn.functional.cross_entropy(big(x), y))
    amp_b.step(opt_b)
    acc = _model()
    opt_a = torch.optim.SGD(acc.parameters(), lr=0.1)
    amp_a = MixedPrecision(resolve_precision("fp32", CPU), max_grad_norm=1.0, accumulation_steps=4)
    stepped = []
    for i in range(4):
        assert amp_a.accumulating is (i < 3)
        amp_a.backward(nn.functional.cross_entropy(acc(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8]))
        stepped.append(amp_a.step(opt_a))
    assert stepped == [False, False, False, True]
    for a, b in zip(big.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert amp_a.steps == 1


def test_fp16_params_with_scaler_refused_up_front():
    model = _model().half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision(resolve_precision("fp16", CPU))
    with pytest.raises(AmpkitError, match="Keep the model in FP32"):
        amp.step(opt)


def test_state_dict_roundtrip_and_precision_change():
    _, model, amp, opt = _engine_loop("fp16", True, _data(3))
    sd = amp.state_dict()
    fresh = MixedPrecision(resolve_precision("fp16", CPU))
    assert fresh.load_state_dict(sd) == []
    assert fresh.stats()["scale"] == amp.stats()["scale"] and fresh.steps == 3
    with pytest.warns(UserWarning, match="scaler state dropped"):
        notes = MixedPrecision(resolve_precision("bf16", CPU)).load_state_dict(sd)
    assert notes
    bf = MixedPrecision(resolve_precision("bf16", CPU)).state_dict()
    with pytest.warns(UserWarning, match="fresh FP16 scaler"):
        MixedPrecision(resolve_precision("fp16", CPU)).load_state_dict(bf)


def test_no_clipping_still_measures_norm():
    model = _model()
    opt = _opt(model, True)
    amp = MixedPrecision("fp32", max_grad_norm=None)
    x, y = _data(1)[0]
    amp.backward(nn.functional.cross_entropy(model(x), y))
    amp.step(opt)
    assert amp.stats()["grad_norm"] > 0


def test_autocast_dtype():
    amp = MixedPrecision("bf16")
    with amp.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with MixedPrecision("fp32").autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32


def test_fp16_scaler_state_lives_in_the_engine_block():
    """The scaler's scale and growth tracker are views of the engine's one device tensor (no extra blocks)."""
    _, model, amp, opt = _engine_loop("fp16", True, _data(3))
    base = amp._counters.state.untyped_storage().data_ptr()
    assert amp.scaler._scale.untyped_storage().data_ptr() == base
    assert amp.scaler._growth_tracker.untyped_storage().data_ptr() == base
    assert amp.scaler._growth_tracker.dtype == torch.int32
    amp.update()  # the last step's scale update waits for the next backward (or update/stats/state_dict)
    assert amp.scaler.state_dict()["_growth_tracker"] == 3  # three good steps since the last backoff
    assert amp.stats()["scale"] == amp.scaler.get_scale() == 65536.0
