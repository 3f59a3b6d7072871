"""The simulated MUSA device's own checks (tests/migrate/musa_device.py), run in one child process by
test_musa_device.py: ``python _musa_device_checks.py`` installs the device and prints a JSON object,
check name -> null (passed) or the error. Importing this module installs nothing."""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHECKS: dict = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _md():
    import musa_device

    return musa_device


def _on_musa(t: torch.Tensor) -> None:
    assert type(t).__name__ == "MusaTensor", type(t)
    assert str(t.device) == "musa:0", t.device


def _same(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    a = a.detach().cpu() if a.device.type != "cpu" else a.detach()
    assert a.device.type == "cpu" and type(a) is torch.Tensor, type(a)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert torch.allclose(a.float(), b.detach().float(), atol=tol, rtol=tol), (a, b)


@check
def device_is_registered():
    assert torch.device("musa").type == "musa"
    assert torch.musa.get_device_name() == "MTT S4000" and torch.musa.is_available()
    assert torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "musa"
    assert torch.get_device_module("musa") is torch.musa
    assert not torch.cuda.is_available()
    import torch_musa  # noqa: F401 - torch_musa < 2.1 needs the import; it must resolve to the same module
    assert sys.modules["torch_musa"] is torch.musa


@check
def factories_make_musa_tensors():
    for t, ref in ((torch.zeros(2, 3, device="musa"), torch.zeros(2, 3)),
                   (torch.ones(4, device="musa:0", dtype=torch.float16), torch.ones(4, dtype=torch.float16)),
                   (torch.arange(5, device=torch.device("musa")), torch.arange(5)),
                   (torch.full((2,), 3.0, device="musa"), torch.full((2,), 3.0)),
                   (torch.tensor([1.0, 2.0], device="musa"), torch.tensor([1.0, 2.0])),
                   (torch.linspace(0, 1, 5, device="musa"), torch.linspace(0, 1, 5)),
                   (torch.eye(3, device="musa"), torch.eye(3))):
        _on_musa(t)
        _same(t, ref)
    for t in (torch.randn(3, device="musa"), torch.empty(2, device="musa"), torch.randint(0, 9, (4,), device="musa"),
              torch.randperm(6, device="musa"), torch.rand(2, 2, device="musa")):
        _on_musa(t)
    assert sorted(torch.randperm(6, device="musa").tolist()) == list(range(6))


@check
def moves_between_cpu_and_musa():
    x = torch.randn(3, 4)
    for m in (x.to("musa"), x.musa(), x.to(torch.device("musa", 0)), x.to("musa", non_blocking=True)):
        _on_musa(m)
        assert m.is_musa and not m.is_cuda and not m.is_cpu
        _same(m.cpu(), x)
        _same(m.to("cpu"), x)
    h = x.to("musa").to(torch.float16)
    _on_musa(h)
    assert h.dtype == torch.float16
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to("musa")
    for p in model.parameters():
        _on_musa(p)
        assert isinstance(p, nn.Parameter) and p.requires_grad
    for b in model.buffers():
        _on_musa(b)
    assert all(p.device.type == "musa" for p in nn.Linear(2, 2).musa().parameters())
    assert next(model.cpu().parameters()).device.type == "cpu"
    # As CPU -> CUDA: the Parameter objects survive the move (an optimizer made before it still works).
    lin = nn.Linear(2, 2)
    kept = list(lin.parameters())
    lin.to("musa")
    assert all(a is b for a, b in zip(kept, lin.parameters())) and kept[0].device.type == "musa"


@check
def mixing_devices_raises_as_on_a_card():
    a = torch.randn(3, device="musa")
    for bad in (lambda: a + torch.randn(3), lambda: torch.randn(3) * a, lambda: torch.mm(a.view(3, 1), torch.ones(1, 3)),
                lambda: nn.Linear(3, 2)(a)):
        try:
            bad()
        except RuntimeError as exc:
            assert "Expected all tensors to be on the same device" in str(exc) and "musa:0" in str(exc), exc
        else:
            raise AssertionError("a musa tensor mixed with a CPU tensor did not raise")
    _on_musa(a + torch.tensor(2.0))  # a 0-dim CPU tensor is a scalar, on a card too
    _on_musa(a[torch.tensor([0, 2])])  # CPU indices are allowed for indexing
    cpu = torch.zeros(3)
    cpu.copy_(a)  # copies cross devices
    _same(cpu, a.cpu())


@check
def cuda_fails_loudly():
    for name, bad in (("cuda()", lambda: torch.zeros(2).cuda()),
                      ("device='cuda'", lambda: torch.zeros(2, device="cuda")),
                      ("to('cuda')", lambda: torch.zeros(2).to("cuda")),
                      ("GradScaler('cuda')", lambda: torch.amp.GradScaler("cuda")),
                      ("torch.cuda.amp.GradScaler()", lambda: torch.cuda.amp.GradScaler()),
                      ("autocast('cuda')", lambda: torch.autocast("cuda").__enter__())):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp's deprecation notice
                bad()
        except (RuntimeError, AssertionError, UserWarning):
            continue
        raise AssertionError(f"{name} did not fail on the simulated MUSA machine")


@check
def autocast_uses_the_cuda_op_lists():
    lin = nn.Linear(4, 4).to("musa")
    x = torch.randn(2, 4, device="musa")
    assert lin(x).dtype == torch.float32
    with torch.autocast("musa", dtype=torch.float16):
        assert torch.is_autocast_enabled("musa")
        y = lin(x)
        assert y.dtype == torch.float16, y.dtype
        _on_musa(y)
        assert (x @ x.t()).dtype == torch.float16
        assert F.mse_loss(y, torch.zeros_like(y)).dtype == torch.float32
        assert torch.softmax(y, -1).dtype == torch.float32
        assert F.layer_norm(y, (4,)).dtype == torch.float32
        assert (y + x).dtype == torch.float32  # not listed: ordinary promotion
        assert y.relu().dtype == torch.float16  # not listed: runs in its input dtype
        try:
            F.binary_cross_entropy(torch.sigmoid(y), torch.ones_like(y))
        except RuntimeError as exc:
            assert "unsafe to autocast" in str(exc)
        else:
            raise AssertionError("binary_cross_entropy under autocast did not raise")
    with torch.autocast(device_type="musa", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    with torch.amp.autocast("musa", enabled=False):
        assert lin(x).dtype == torch.float32
    with torch.musa.amp.autocast(dtype=torch.float16):
        assert lin(x).dtype == torch.float16
        assert nn.Linear(4, 2)(torch.randn(2, 4)).dtype == torch.float32  # CPU ops: not musa autocast's
    conv = nn.Conv2d(3, 4, 3).to("musa")
    with torch.autocast("musa", dtype=torch.float16):
        assert conv(torch.randn(1, 3, 6, 6, device="musa")).dtype == torch.float16


@check
def gradscaler_is_a_musa_one_and_works():
    s = torch.musa.amp.GradScaler()
    assert isinstance(s, torch.amp.GradScaler) and s._device == "musa" and s.is_enabled()
    s2 = torch.amp.GradScaler("musa", init_scale=1024.0)
    assert s2._device == "musa" and s2.is_enabled()
    model = nn.Linear(3, 1).to("musa")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().cpu().clone()
    with torch.autocast("musa", dtype=torch.float16):
        loss = model(torch.randn(4, 3, device="musa")).float().pow(2).mean()
    s2.scale(loss).backward()
    s2.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    s2.step(opt)
    s2.update()
    assert not torch.equal(model.weight.detach().cpu(), before), "a finite step did not move the weights"
    assert s2.get_scale() == 1024.0
    opt.zero_grad()
    with torch.autocast("musa", dtype=torch.float16):
        loss = model(torch.full((4, 3), float("inf"), device="musa")).float().sum()
    s2.scale(loss).backward()
    moved = model.weight.detach().cpu().clone()
    s2.step(opt)
    s2.update()
    assert torch.equal(model.weight.detach().cpu(), moved), "an inf gradient was stepped"
    assert s2.get_scale() == 512.0, s2.get_scale()


def _train(device: str, steps: int = 3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    emb = nn.Embedding(7, 8)
    lstm = nn.LSTM(8, 6, num_layers=2)
    gru = nn.GRU(6, 6)
    params = [*model.parameters(), *emb.parameters(), *lstm.parameters(), *gru.parameters()]
    for m in (model, emb, lstm, gru):
        m.to(device)
    opt = torch.optim.AdamW(params, lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(2, 1, 8, 8, generator=gen).to(device)
        tokens = torch.randint(0, 7, (5, 2), generator=gen).to(device)
        target = torch.randint(0, 5, (2,), generator=gen).to(device)
        out, _ = lstm(emb(tokens))
        out, _ = gru(out)
        q = out.permute(1, 0, 2).unsqueeze(1)
        att = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        loss = F.cross_entropy(model(x), target) + att.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().cpu() for p in params], loss.detach().cpu()


@check
def training_matches_the_cpu():
    """The wrapper computes what the CPU computes: conv, batch norm, embedding, a 2-layer LSTM and a GRU
    (through the GPU-only fused cells), SDPA, cross entropy, AdamW (foreach) give the same parameters after
    3 steps."""
    musa_params, musa_loss = _train("musa")
    cpu_params, cpu_loss = _train("cpu")
    for a, b in zip(musa_params, cpu_params):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert torch.allclose(musa_loss, cpu_loss, atol=1e-5)


@check
def musa_has_its_own_rng():
    torch.manual_seed(3)
    a = torch.randn(4, device="musa")
    torch.manual_seed(3)
    b = torch.randn(4, device="musa")
    _same(a.cpu(), b.cpu())
    torch.manual_seed(5)
    cpu_first = torch.randn(3)
    torch.manual_seed(5)
    torch.musa.manual_seed(11)  # seeds the card only: the CPU stream is untouched
    torch.randn(3, device="musa")
    assert torch.equal(torch.randn(3), cpu_first)
    state = torch.musa.get_rng_state()
    c = torch.rand(3, device="musa")
    torch.musa.set_rng_state(state)
    _same(torch.rand(3, device="musa").cpu(), c.cpu())
    d = F.dropout(torch.ones(1000, device="musa"), 0.5, training=True)
    _on_musa(d)
    assert 300 < int((d == 0).sum()) < 700


@check
def memory_stats_count_live_tensors():
    torch.musa.empty_cache()
    torch.musa.reset_peak_memory_stats()
    base = torch.musa.memory_allocated()
    big = torch.empty(1 << 18, device="musa")  # 1 MiB
    assert torch.musa.memory_allocated() - base == 1 << 20
    view = big[10:]
    assert torch.musa.memory_allocated() - base == 1 << 20, "a view counted its storage twice"
    del big, view
    assert torch.musa.memory_allocated() == base
    assert torch.musa.max_memory_allocated() >= base + (1 << 20)
    torch.musa.reset_peak_memory_stats()
    assert torch.musa.max_memory_allocated() == base
    free, total = torch.musa.mem_get_info()
    assert total == torch.musa.get_device_properties(0).total_memory and free <= total


@check
def sync_streams_events():
    torch.musa.synchronize()
    start, end = torch.musa.Event(enable_timing=True), torch.musa.Event(enable_timing=True)
    start.record()
    time.sleep(0.01)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 5.0
    s = torch.musa.Stream()
    with torch.musa.stream(s):
        _on_musa(torch.ones(2, device="musa") * 2)
    torch.musa.current_stream().wait_stream(s)


@check
def save_and_load_like_a_card():
    sd = nn.Linear(3, 2).to("musa").state_dict()
    buf = io.BytesIO()
    torch.save({"model": sd, "step": 3}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["model"]
    for k, v in loaded.items():
        _on_musa(v)
        _same(v.cpu(), sd[k].cpu())
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu", weights_only=True)["model"]
    assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in on_cpu.values())
    buf = io.BytesIO()
    torch.save(nn.Linear(3, 2).to("musa"), buf)  # a whole module: its parameters stay Parameters
    buf.seek(0)
    with torch.serialization.safe_globals([nn.Linear]):
        module = torch.load(buf)
    assert [n for n, _ in module.named_parameters()] == ["weight", "bias"]
    _on_musa(module.weight)


@check
def printing_names_the_device():
    text = repr(torch.ones(2, device="musa"))
    assert text.startswith("tensor([1., 1.]") and "device='musa:0'" in text, text
    assert f"{torch.ones((), device='musa').item():.1f}" == "1.0"


@check
def limits_are_as_documented():
    try:
        torch.Generator(device="musa")
    except RuntimeError:
        pass
    else:
        raise AssertionError("torch.Generator(device='musa') works: update the documented limits")
    try:
        torch.ones(2, device="musa").numpy()
    except TypeError as exc:
        assert "Use Tensor.cpu()" in str(exc)
    else:
        raise AssertionError("numpy() of a musa tensor must raise, as on a card")
    pinned = torch.ones(2).pin_memory()
    assert pinned.device.type == "cpu" and not pinned.is_pinned()


def main() -> None:
    _md().install("MTT S4000")
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = None
        except BaseException:  # noqa: BLE001 - reported to the parent, one entry per check
            results[name] = traceback.format_exc(limit=6)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
