"""Shared, expensive results for tests/verify: each real comparison runs once per session."""

from __future__ import annotations

import os

import pytest

from task_specs import HARMFUL, OVERFLOW_NORM, TOY  # noqa: F401 (the specs live in task_specs.py)


@pytest.fixture(scope="session")
def toy_compare(tmp_path_factory):
    """The toy task in BF16, 3 seeds x 40 steps, with its report written. (Two seeds with the same accuracy on the
    toy's 128 test examples cannot show a harm below 1 %: the paired verdict says inconclusive, rightly.)"""
    from ampkit.verify.compare import compare

    out = tmp_path_factory.mktemp("toy_compare")
    return compare(TOY, precision="bf16", seeds=3, steps=40, out=out)


@pytest.fixture(scope="session")
def harmful_compare(tmp_path_factory):
    """The planted FP16-overflow task in FP16: must fail (and has a scale trace to plot)."""
    from ampkit.verify.compare import compare

    out = tmp_path_factory.mktemp("harmful_compare")
    return compare(HARMFUL, precision="fp16", seeds=2, steps=30, out=out)


@pytest.fixture(scope="session")
def digits_compare(tmp_path_factory):
    """The built-in digits task in BF16 on the CPU: the README quick start, slightly shortened."""
    from ampkit.verify.compare import compare

    os.environ.pop("AMPKIT_DEVICE", None)
    out = tmp_path_factory.mktemp("digits_compare")
    return compare("digits", precision="bf16", seeds=3, steps=200, device="cpu", out=out)



@pytest.fixture(scope="session")
def overflow_explain(tmp_path_factory):
    """The planted absorbed FP16 overflow (HandNorm) with --explain, 2 seeds x 20 steps, report written."""
    from ampkit.verify.compare import compare

    out = tmp_path_factory.mktemp("overflow_explain")
    # A budget in seconds, not the default (twice the comparison's own time): on a busy machine the reruns
    # can take longer than the comparison did, and the fixes would go untried.
    return compare(OVERFLOW_NORM, precision="fp16", seeds=2, steps=20, run_audit=False, explain=True,
                   explain_budget=300, out=out)
