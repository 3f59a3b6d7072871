"""FP8 training: refusal where the card has none, the layer filter and its report, torchao conversion
(torchao's Float8Linear runs on the CPU too, so conversion and state dicts are tested for real here)."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys

import pytest
import torch
from torch import nn

import ampkit
from ampkit.cli import main
from ampkit.device import detect_device
from ampkit.engine import MixedPrecision
from ampkit.errors import AmpkitError, PrecisionUnsupported, UsageError
from ampkit.engine.fp8 import FP8Filter, convert, plan, require_torchao, torchao_missing
from ampkit.device.hardware import capabilities, probe_fp8
from ampkit.device.policy import resolve_precision

needs_torchao = pytest.mark.skipif(torchao_missing() is not None, reason="torchao is not installed (ampkit[fp8])")


class Tiny(nn.Module):
    """Layers of every kind the filter decides on."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 512)  # converts
        self.down = nn.Linear(512, 256)  # converts
        self.small = nn.Linear(256, 64)  # too small
        self.odd = nn.Linear(64, 260)  # 260 is not a multiple of 16
        self.attn = nn.MultiheadAttention(64, 2)  # its out_proj is a Linear subclass: never converted
        self.lm_head = nn.Linear(256, 512)  # the output head, by name

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        return self.lm_head(h) + self.odd(self.small(h)).sum(-1, keepdim=True)


@pytest.fixture
def no_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)


# ------------------------------------------------------------------------------ refusal
def test_cpu_refuses_fp8_in_one_line_naming_the_card_and_what_it_supports():
    with pytest.raises(PrecisionUnsupported) as err:
        resolve_precision("fp8", "cpu")
    msg = str(err.value)
    assert "has no FP8 training" in msg and "BF16" in msg and "use --precision bf16" in msg and "\n" not in msg
    with pytest.raises(PrecisionUnsupported, match="has no FP8 training"):
        MixedPrecision("fp8", device=detect_device("cpu"))
    with pytest.raises(PrecisionUnsupported, match="has no FP8 training"):
        resolve_precision("FLOAT8", "cpu")


def test_doctor_refuses_fp8_on_the_cpu(capsys):
    assert main(["doctor", "--precision", "fp8", "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["check"]["usable"] is False and "no FP8 training" in r["check"]["reason"]
    # The card table says no: the FP8 probe is not run (it would pass on torch's CPU kernels: emulation).
    assert r["fp8"]["supported"] is False and r["fp8"]["provenance"] == "table" and r["fp8"]["probe"] is None
    assert main(["doctor"]) == 0
    assert "FP8 training" in capsys.readouterr().out


@pytest.mark.parametrize("card, supports, fix", [("MTT S80", "FP16", "fp16"), ("MTT S4000", "BF16 and FP16", "bf16")])
def test_musa_cards_without_fp8_are_refused(simulated_musa, card, supports, fix):
    simulated_musa(card)
    with pytest.raises(PrecisionUnsupported) as err:
        resolve_precision("fp8")
    msg = str(err.value)
    assert card in msg and f"it supports {supports}" in msg and msg.endswith(f"use --precision {fix}")


def test_nvidia_below_capability_8_9_is_refused(simulated_cuda):
    simulated_cuda((8, 0))
    with pytest.raises(PrecisionUnsupported, match=r"capability 8\.0\) has no FP8 training .*use --precision bf16"):
        resolve_precision("fp8", probe=False)


@needs_torchao
def test_hopper_resolves_fp8_as_bf16_autocast_without_scaler(simulated_cuda):
    simulated_cuda((9, 0))
    p = resolve_precision("fp8", probe=False)
    assert (p.name, p.dtype, p.use_scaler, p.autocast_enabled, p.is_low_precision) == (
        "fp8", torch.bfloat16, False, True, True)
    assert "FP8 requested" in p.reason and "torchao" in p.reason


def test_fp8_card_without_torchao_gets_the_install_command(simulated_cuda, no_torchao):
    simulated_cuda((9, 0))
    assert torchao_missing() is not None
    with pytest.raises(PrecisionUnsupported, match=r"needs torchao.*pip install 'ampkit\[fp8\]'"):
        resolve_precision("fp8", probe=False)
    with pytest.raises(AmpkitError, match="needs torchao"):
        require_torchao()
    probe = probe_fp8(detect_device())
    assert probe.errored and "torchao" in probe.message


@needs_torchao
def test_fp8_probe_runs_and_its_check_can_fail():
    cpu = detect_device("cpu")
    ok = probe_fp8(cpu)  # torch's CPU _scaled_mm runs the real torchao layer
    assert ok.ok and ok.message.startswith("pass") and 0 < ok.max_rel_error < 0.1
    strict = probe_fp8(cpu, rtol=1e-6)  # FP8 is not BF16: the comparison must be able to say so
    assert not strict.ok and not strict.errored and "exceeds" in strict.message
    caps = capabilities(cpu, probe=False, fp8_probe=True)  # the table says no: the probe is not run on the CPU
    assert caps.fp8.supported is False and caps.fp8.probe is None


# ------------------------------------------------------------------------------ the filter
def test_plan_converts_big_aligned_layers_and_says_why_it_keeps_the_rest():
    report = plan(Tiny())
    assert report.recipe == "tensorwise"
    assert report.converted == ("up", "down")
    kept = dict(report.kept)
    assert set(kept) == {"small", "odd", "lm_head"}  # attn.out_proj is not a plain nn.Linear
    assert kept["lm_head"] == "output head"
    assert kept["small"].startswith("small: 256x64")
    assert "not divisible by 16" in kept["odd"]
    line = report.summary()
    assert line.startswith("FP8 tensorwise: 2 of 5 linear layers converted; kept in BF16: ") and "lm_head (output head)" in line
    assert report.to_dict()["kept"][0] == {"name": "small", "reason": kept["small"]}


def test_filter_options_and_torchao_style_callables():
    assert plan(Tiny(), FP8Filter(min_features=32, keep=("down",))).converted == ("up", "small")
    assert plan(Tiny(), FP8Filter(keep_head=False)).converted == ("up", "down", "lm_head")
    assert plan(Tiny(), lambda m, name: name.startswith("u")).converted == ("up",)
    assert plan(nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512))).kept == (("1", "output head"),)  # last Linear
    assert plan(torch.compile(Tiny()), recipe="ROWWISE").converted == ("up", "down")  # _orig_mod. stripped


def test_bad_recipe_filter_or_model_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown FP8 recipe 'delayed'"):
        plan(Tiny(), recipe="delayed")
    with pytest.raises(UsageError, match="keep takes a tuple"):
        FP8Filter(keep="up")
    with pytest.raises(UsageError, match="has no nn.Linear"):
        plan(nn.Sequential(nn.ReLU()))
    with pytest.raises(UsageError, match="no linear layer of Sequential qualifies"):
        convert(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)))


# ------------------------------------------------------------------------------ conversion (torchao)
@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_convert_swaps_exactly_the_reported_layers_and_keeps_parameters(recipe):
    model = Tiny()
    params = {n: p for n, p in model.named_parameters()}
    report = convert(model, recipe=recipe)
    assert report.converted == ("up", "down") and report.recipe == recipe
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kinds["up"] == kinds["down"] == "Float8Linear"
    assert kinds["small"] == kinds["odd"] == kinds["lm_head"] == "Linear"
    granularity = model.up.config.cast_config_weight.scaling_granularity.name
    assert granularity == {"tensorwise": "TENSORWISE", "rowwise": "AXISWISE"}[recipe]
    # the same Parameter objects: an optimizer built before the conversion still updates them
    assert all(p is params[n] for n, p in model.named_parameters())


@needs_torchao
def test_converted_model_trains_on_the_cpu_close_to_bf16():
    torch.manual_seed(0)
    ref = Tiny()
    model = Tiny()
    model.load_state_dict(ref.state_dict())
    convert(model)
    x = torch.randn(32, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out8, out_ref = model(x), ref(x)
    out8.float().square().mean().backward()
    assert torch.isfinite(model.up.weight.grad).all()
    err = float((out8.float() - out_ref.float()).abs().max() / out_ref.float().abs().max())
    assert 0 < err < 0.1, err  # FP8 differs from BF16, but not by much


@needs_torchao
def test_fp8_checkpoints_load_into_bf16_fp32_models_and_back():
    torch.manual_seed(0)
    fp8_model = Tiny()
    convert(fp8_model)
    plain = Tiny()
    assert list(fp8_model.state_dict()) == list(plain.state_dict())  # Float8Linear keys are nn.Linear's
    state = fp8_model.state_dict()
    plain.load_state_dict(state, strict=True)  # FP8 run -> FP32/BF16 run
    x = torch.randn(4, 256)
    assert torch.equal(plain.up(x), nn.functional.linear(x, fp8_model.up.weight, fp8_model.up.bias))
    torch.manual_seed(1)
    other = Tiny()
    back = Tiny()
    convert(back)
    back.load_state_dict(other.state_dict(), strict=True)  # and back: FP32 checkpoint -> FP8 model
    assert type(back.up).__name__ == "Float8Linear" and torch.equal(back.up.weight, other.up.weight)


# ------------------------------------------------------------------------------ on a GPU with FP8
@pytest.mark.gpu
@needs_torchao
def test_gpu_fp8_probe_and_resolve():
    dev = detect_device()
    caps = capabilities(dev, fp8_probe=True)
    if not caps.fp8.supported:
        pytest.skip(f"{caps.name} has no FP8")
    assert caps.fp8.probe.startswith("pass"), caps.fp8.probe
    assert resolve_precision("fp8", dev).name == "fp8"


@pytest.mark.gpu
@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpu_fp8_training_step_compiled_close_to_bf16(recipe):
    dev = detect_device()
    if not capabilities(dev, probe=False).fp8.supported:
        pytest.skip("no FP8 on this card")
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.Linear(1024, 256)).to(
        dev.torch_device)
    model = copy.deepcopy(ref)
    report = convert(model, recipe=recipe)
    assert report.converted == ("0", "2") and dict(report.kept) == {"3": "output head"}
    compiled = torch.compile(model)
    amp = MixedPrecision("fp8", device=dev)
    x = torch.randn(256, 1024, device=dev.torch_device)
    with amp.autocast():
        out8 = compiled(x)
        out_ref = ref(x)
    out8.float().square().mean().backward()
    err = float((out8.float() - out_ref.float()).abs().max() / out_ref.float().abs().max())
    assert err < 0.1, err
    assert type(model[0]).__name__ == "Float8Linear" and torch.isfinite(model[0].weight.grad).all()


def _fp8_task(seed: int = 0):
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(512, 256, generator=g), torch.randint(0, 16, (512,), generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 16))

    def batch(step):
        i = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(step))
        return x[i], y[i]

    return ampkit.Task(name="fp8-mlp", model=model, batch=batch,
                       loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), samples_per_batch=64)


@pytest.mark.gpu
@needs_torchao
def test_gpu_fp8_trains_as_a_step_graph_with_the_eager_losses():
    # torchao's dynamic (tensorwise) scales are computed on the device: the FP8 step is captured like any other,
    # and replaying it gives the eager losses step by step.
    if not capabilities(detect_device(), probe=False).fp8.supported:
        pytest.skip("no FP8 on this card")

    def run(graph):
        # fp8_layers="eligible": this checks FP8's numerics under a graph; the model is too small for FP8 to pay.
        return ampkit.train(ampkit.TrainConfig(task="fp8-mlp", precision="fp8", steps=12, log_every=1,
                                               evaluate=False, graph=graph, fp8_layers="eligible"), task=_fp8_task())

    eager, graphed = run(False), run(None)
    assert graphed.step_graph is True and eager.step_graph is False, graphed.notes
    assert [h["step"] for h in graphed.history] == [h["step"] for h in eager.history]
    for a, b in zip(eager.history, graphed.history):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), (a, b)


def test_train_in_fp8_converts_the_layers_and_says_which():
    # FP8 is refused on this CPU, but torchao's Float8Linear runs here: a Precision named fp8 (BF16 autocast,
    # what resolve_precision gives on an FP8 card) shows that the trainer converts before training.
    pytest.importorskip("torchao")
    fp8 = dataclasses.replace(resolve_precision("bf16", "cpu"), name="fp8", reason="test: fp8 on the CPU")
    task = _fp8_task()
    result = ampkit.train(ampkit.TrainConfig(task="fp8-mlp", precision="fp8", steps=3, evaluate=False),
                          task=task, precision=fp8)
    assert [type(m).__name__ for m in task.model if not isinstance(m, torch.nn.ReLU)] == \
        ["Float8Linear", "Float8Linear", "Linear"]  # the output head stays in BF16
    assert any(n.startswith("FP8 tensorwise: 2 of 3 linear layers converted") for n in result.notes), result.notes
    assert result.final_loss is not None
