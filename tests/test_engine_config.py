"""AmpConfig: validation of every setting, presets, replace."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ampkit.engine.config import DEFAULT_SKIP_CHECK_EVERY, PRESETS, AmpConfig
from ampkit.errors import UsageError

BAD = [
    ("max_grad_norm", math.nan), ("max_grad_norm", math.inf), ("max_grad_norm", -1.0), ("max_grad_norm", "1"),
    ("accumulation_steps", 0), ("accumulation_steps", 2.5), ("accumulation_steps", True),
    ("init_scale", 0.0), ("init_scale", -2.0), ("init_scale", math.inf), ("init_scale", math.nan),
    ("growth_factor", 1.0), ("growth_factor", 0.5), ("growth_factor", math.nan),
    ("backoff_factor", 1.0), ("backoff_factor", 0.0), ("backoff_factor", 1.5), ("backoff_factor", math.nan),
    ("growth_interval", 0), ("growth_interval", 1.5),
    ("min_scale", -1.0), ("min_scale", math.nan),
    ("max_consecutive_skips", 0), ("skip_check_every", 0), ("skip_check_every", 2.0),
    ("fp32_modules", 3), ("fp32_modules", [1]),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_bad_values_are_usage_errors_naming_the_setting(name, value):
    with pytest.raises(UsageError, match=name) as info:
        AmpConfig(**{name: value})
    assert "\n" not in str(info.value)


def test_defaults_and_normal_forms():
    cfg = AmpConfig()
    assert (cfg.init_scale, cfg.growth_factor, cfg.backoff_factor, cfg.growth_interval) == (2.0**16, 2.0, 0.5, 2000)
    assert cfg.clip_norm is None and AmpConfig(max_grad_norm=0).clip_norm is None
    assert AmpConfig(max_grad_norm=2).clip_norm == 2.0
    assert cfg.check_every == DEFAULT_SKIP_CHECK_EVERY
    assert AmpConfig(skip_check_every=7).check_every == 7
    assert AmpConfig(max_consecutive_skips=None).check_every is None
    assert AmpConfig(fp32_modules="a.b, *.norm").fp32_specs == ("a.b", "*.norm")
    assert AmpConfig(fp32_modules=[torch.nn.LayerNorm, "x"]).fp32_specs == (torch.nn.LayerNorm, "x")


def test_frozen_keyword_only_and_replace_checks():
    cfg = AmpConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_grad_norm = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        AmpConfig(1.0)  # type: ignore[misc]
    assert cfg.replace(max_grad_norm=3.0).max_grad_norm == 3.0 and cfg.max_grad_norm is None
    with pytest.raises(UsageError, match="growth_interval"):
        cfg.replace(growth_interval=0)
    with pytest.raises(UsageError, match="unknown engine setting.*bogus"):
        cfg.replace(bogus=1)


def test_presets():
    assert AmpConfig.preset("default") == AmpConfig()
    torch_like = AmpConfig.preset("TORCH")
    assert torch_like.min_scale == 0 and torch_like.max_consecutive_skips is None
    assert AmpConfig.preset("fp16-safe", growth_interval=10).growth_interval == 10
    assert all(isinstance(p, AmpConfig) for p in PRESETS.values())
    with pytest.raises(UsageError, match="unknown engine preset 'nope'.*default"):
        AmpConfig.preset("nope")
    assert AmpConfig(fp32_modules=[torch.nn.LayerNorm]).to_dict()["fp32_modules"] == [
        "torch.nn.modules.normalization.LayerNorm"]
