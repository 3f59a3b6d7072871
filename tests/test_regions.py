"""FP32 regions: matched modules run with autocast off and FP32 inputs; hooks come off cleanly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.engine.regions import FP32Regions, apply_fp32_regions, normalize_fp32_modules, strip_wrapper_prefixes

LOW = [torch.bfloat16, torch.float16]


class ScaledNorm(nn.Module):
    """A hand-written normalisation that overflows FP16 inside the module: (300*x)**2 is inf for |x| > 0.85,
    the output x / inf is 0, finite, and wrong. In FP32 it is a plain RMS normalisation (divided by 300)."""

    def forward(self, x):
        return x / torch.sqrt(((300 * x) ** 2).mean(-1, keepdim=True))


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.norm = ScaledNorm()
        self.fc2 = nn.Linear(d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) + x


class Net(nn.Module):
    def __init__(self, d=32, n=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _record_dtypes(model):
    seen = {}
    handles = [m.register_forward_hook(lambda mod, a, out, name=name: seen.__setitem__(name, out.dtype))
               for name, m in model.named_modules() if name]
    return seen, handles


# ------------------------------------------------------------------------------ normalize
def test_normalize_accepts_names_globs_presets_types_and_lists():
    assert normalize_fp32_modules(None) == ()
    assert normalize_fp32_modules("blocks.0.norm") == ("blocks.0.norm",)
    assert normalize_fp32_modules(" *.norm , preset:LOSS,blocks.*.fc[12]") == ("*.norm", "preset:loss", "blocks.*.fc[12]")
    assert normalize_fp32_modules(nn.LayerNorm) == (nn.LayerNorm,)
    assert normalize_fp32_modules(["a.b", nn.LayerNorm, "a.b", "preset:attention"]) == ("a.b", nn.LayerNorm,
                                                                                       "preset:attention")


@pytest.mark.parametrize("bad, words", [
    ("", "empty"), ("a,,b", "empty"), ("a b", "not a dotted"), ("a..b", "not a dotted"), (".a", "not a dotted"),
    ("preset:bogus", "unknown preset"), (3, "unsupported"), ([3], "not a name"), (int, "not a name"),
    ([nn.Linear(2, 2)], "not a name"),
])
def test_normalize_refuses_bad_input_in_one_line(bad, words):
    with pytest.raises(UsageError) as err:
        normalize_fp32_modules(bad)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_strip_wrapper_prefixes():
    assert strip_wrapper_prefixes("_orig_mod.module.blocks.0") == "blocks.0"
    assert strip_wrapper_prefixes("module") == ""
    assert strip_wrapper_prefixes("blocks.module.x") == "blocks.module.x"


# ------------------------------------------------------------------------------ matching
def test_spec_matching_nothing_names_the_spec_and_real_modules():
    with pytest.raises(UsageError) as err:
        apply_fp32_regions(Net(), ["*.norm", "blocks.9.norm"], device_type="cpu")
    msg = str(err.value)
    assert "'blocks.9.norm'" in msg and "blocks.0" in msg and "\n" not in msg
    with pytest.raises(UsageError, match="'GroupNorm' matches no module"):
        apply_fp32_regions(Net(), nn.GroupNorm, device_type="cpu")


def test_names_globs_types_and_presets_match():
    net = Net()
    assert apply_fp32_regions(net, "*.norm", device_type="cpu").names == ("blocks.0.norm", "blocks.1.norm")
    assert apply_fp32_regions(net, "blocks.1.fc?", device_type="cpu").names == ("blocks.1.fc1", "blocks.1.fc2")
    assert apply_fp32_regions(net, ScaledNorm, device_type="cpu").names == ("blocks.0.norm", "blocks.1.norm")
    # The class-name heuristic of the norm preset catches the hand-written ScaledNorm.
    assert apply_fp32_regions(net, "preset:norm", device_type="cpu").names == ("blocks.0.norm", "blocks.1.norm")
    # A type that matches the root itself is named by its class.
    assert apply_fp32_regions(net, Net, device_type="cpu").names == ("Net",)


def test_presets_cover_the_usual_suspects():
    model = nn.ModuleDict({
        "ln": nn.LayerNorm(8), "bn": nn.BatchNorm2d(3), "gn": nn.GroupNorm(2, 4), "inorm": nn.InstanceNorm1d(3),
        "rms": nn.RMSNorm(8), "mha": nn.MultiheadAttention(8, 2), "sm": nn.Softmax(-1),
        "attn": nn.Linear(8, 8), "ce": nn.CrossEntropyLoss(), "bce": nn.BCEWithLogitsLoss(), "fc": nn.Linear(8, 8),
    })
    names = lambda p: set(apply_fp32_regions(model, p, device_type="cpu").names)  # noqa: E731
    assert names("preset:norm") == {"ln", "bn", "gn", "inorm", "rms"}
    # mha's out_proj is a plain Linear (NonDynamicallyQuantizableLinear): not matched on its own
    assert names("preset:softmax") == {"mha", "sm", "attn"} == names("preset:attention")
    assert names("preset:loss") == {"ce", "bce"}


def test_wrapper_prefixes_are_stripped():
    class Wrapper(nn.Module):  # the shape of DDP: the user's model under .module
        def __init__(self, m):
            super().__init__()
            self.module = m

        def forward(self, x):
            return self.module(x)

    wrapped = Wrapper(Net())
    assert apply_fp32_regions(wrapped, "blocks.0.norm", device_type="cpu").names == ("blocks.0.norm",)
    compiled = torch.compile(Net())
    assert apply_fp32_regions(compiled, "*.fc2", device_type="cpu").names == ("blocks.0.fc2", "blocks.1.fc2")


# ------------------------------------------------------------------------------ behaviour
@pytest.mark.parametrize("dtype", LOW)
def test_matched_modules_are_fp32_and_the_rest_low_precision(dtype):
    net = Net()
    regions = apply_fp32_regions(net, ["blocks.0.fc2", "head"], device_type="cpu")
    seen, _ = _record_dtypes(net)
    with torch.autocast("cpu", dtype=dtype):
        out = net(torch.randn(4, 32))
    assert out.dtype == torch.float32
    assert seen["blocks.0.fc2"] == seen["head"] == torch.float32
    assert seen["blocks.0.fc1"] == seen["blocks.1.fc1"] == seen["blocks.1.fc2"] == dtype
    assert torch.is_autocast_enabled("cpu") is False
    regions.remove()


def test_inputs_are_cast_to_fp32_in_args_kwargs_and_nested_containers():
    class Probe(nn.Module):
        def forward(self, x, pair, *, extra, table):
            self.seen = (x.dtype, [t.dtype for t in pair], extra.dtype, table["a"].dtype, table["n"],
                         table["i"].dtype, table["d"].dtype, torch.is_autocast_enabled("cpu"))
            return x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.probe = Probe()

        def forward(self, x):
            h = x.to(torch.bfloat16)
            return self.probe(h, [h, (h * 2)], extra=h, table={"a": h, "n": 3, "i": torch.ones(2, dtype=torch.long),
                                                                "d": torch.ones(2, dtype=torch.float64)})

    outer = Outer()
    apply_fp32_regions(outer, "probe", device_type="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outer(torch.randn(2, 2))
    f32 = torch.float32
    # FP16/BF16 become FP32; integers, non-tensors and the wider FP64 are left alone
    assert outer.probe.seen == (f32, [f32, f32], f32, f32, 3, torch.long, torch.float64, False)


def test_remove_restores_bit_identical_behaviour_and_is_idempotent():
    torch.manual_seed(1)
    net = Net()
    never_hooked = copy.deepcopy(net)
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = never_hooked(x)
    regions = apply_fp32_regions(net, ["*.norm", "head"], device_type="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hooked = net(x)
    assert not torch.equal(hooked.float(), ref.float())  # the regions did change something
    regions.remove()
    regions.remove()
    assert not regions.active
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after = net(x)
    assert after.dtype == ref.dtype and torch.equal(after, ref)


def test_context_manager_removes_hooks():
    net = Net()
    with apply_fp32_regions(net, "*.norm", device_type="cpu") as regions:
        assert isinstance(regions, FP32Regions) and regions.active
    assert not regions.active
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_exception_inside_forward_leaves_autocast_state_intact():
    class Flaky(nn.Module):
        fail = True

        def forward(self, x):
            if self.fail:
                raise RuntimeError("boom")
            return x @ x.T

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.flaky = Flaky()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.flaky(self.fc(x))

    outer = Outer()
    regions = apply_fp32_regions(outer, "flaky", device_type="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="boom"):
            outer(torch.randn(2, 4))
        assert torch.is_autocast_enabled("cpu") is True
        assert outer.fc(torch.randn(2, 4)).dtype == torch.bfloat16
        Flaky.fail = False
        assert outer(torch.randn(2, 4)).dtype == torch.float32  # the region still works afterwards
    assert regions._depth == 0


def test_nested_matches_enter_the_region_once(monkeypatch):
    net = Net()
    entered = []
    real = torch.autocast

    class Counting(real):
        def __enter__(self):
            entered.append(self.fast_dtype)
            return super().__enter__()

    monkeypatch.setattr(torch, "autocast", Counting)
    apply_fp32_regions(net, ["blocks.0", "blocks.0.*"], device_type="cpu")
    seen, _ = _record_dtypes(net)
    with real("cpu", dtype=torch.bfloat16):
        net(torch.randn(2, 32))
        assert torch.is_autocast_enabled("cpu") is True
    assert len(entered) == 1  # blocks.0 entered; fc1, norm, fc2 inside it did not enter again
    assert seen["blocks.0.fc1"] == seen["blocks.0.fc2"] == seen["blocks.0"] == torch.float32
    assert seen["blocks.1.fc1"] == torch.bfloat16


def test_compiled_model_works_with_regions_and_after_remove():
    torch._dynamo.reset()
    net = Net(d=16)
    compiled = torch.compile(net)
    x = torch.randn(4, 16)
    regions = apply_fp32_regions(compiled, ["blocks.0.fc2"], device_type="cpu")
    seen, handles = _record_dtypes(net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        eager = net(x)
    assert seen["blocks.0.fc2"] == torch.float32 and seen["blocks.1.fc2"] == torch.bfloat16
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), eager.float(), atol=1e-2)
    regions.remove()
    for h in handles:
        h.remove()
    seen, _ = _record_dtypes(net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(x)
    assert seen["blocks.0.fc2"] == torch.bfloat16  # guards saw the hooks go: recompiled without the region


# ------------------------------------------------------------------------------ the absorbed overflow
class OverflowDemo(nn.Module):
    """Linear -> hand-written norm -> Linear (no bias, so the norm's output is all that reaches the loss)."""

    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = ScaledNorm()
        self.out = nn.Linear(d, 4, bias=False)

    def forward(self, x):
        return self.out(self.norm(self.fc(x)))


def test_absorbed_fp16_overflow_is_wrong_without_regions_and_right_with_them():
    """FP16 output stays finite, so neither a scaler nor a NaN check sees a problem, yet it is wrong;
    an FP32 region on the hand-written norm makes it match FP32."""
    torch.manual_seed(0)
    net = OverflowDemo()
    x = torch.randn(16, 32) * 2
    with torch.no_grad():
        ref = net(x)
        with torch.autocast("cpu", dtype=torch.float16):
            plain = net(x)
        assert torch.isfinite(plain).all()
        err_plain = float((plain.float() - ref).abs().max() / ref.abs().max())
        with apply_fp32_regions(net, "norm", device_type="cpu"):
            with torch.autocast("cpu", dtype=torch.float16):
                fixed = net(x)
        err_fixed = float((fixed.float() - ref).abs().max() / ref.abs().max())
    assert err_plain > 0.5 and err_fixed < 1e-2, (err_plain, err_fixed)
    assert fixed.dtype == torch.float16  # only the norm ran in FP32: the output layer is still FP16
