"""The rewritten lesson code runs on the CPU: a rewrite must be Python that works, not just parses."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from ampkit.migrate import migrate_source

FIXTURES = Path(__file__).parent / "fixtures"


def _load(name: str, *, on_cpu: bool = False, monkeypatch=None) -> dict:
    """Migrate a fixture (agnostic target) and execute it as a module; ``on_cpu`` points the
    lesson's hard-coded MUSA device at the CPU, the way a user without a card would."""
    code = migrate_source((FIXTURES / name).read_text(encoding="utf-8"), filename=name).new_code
    if on_cpu:
        code = code.replace('"musa"', '"cpu"')
        # `import torch_musa` must import on a machine without a card; the module is never used.
        monkeypatch.setitem(sys.modules, "torch_musa", types.ModuleType("torch_musa"))
    namespace: dict = {"__name__": "lesson"}
    exec(compile(code, name, "exec"), namespace)
    return namespace


def _loader(n: int = 6):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(n)]


def test_device_parameterised_loop_runs_on_cpu():
    ns = _load("lesson/device_parameter.in.py")
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    loss = ns["train"](model, _loader(), "cpu")
    assert torch.isfinite(loss)


def test_official_snippet_runs_on_cpu(monkeypatch):
    ns = _load("lesson/official_snippet.in.py", on_cpu=True, monkeypatch=monkeypatch)
    loss = ns["train_in_amp"](torch.bfloat16)  # the lesson's own assert checks the autocast dtype
    assert torch.isfinite(loss)


def test_full_loop_trains_saves_and_resumes_safely(tmp_path, monkeypatch):
    ns = _load("lesson/full_loop.in.py", on_cpu=True, monkeypatch=monkeypatch)
    ckpt = str(tmp_path / "amp_ckpt.pt")
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    ns["train"](model, _loader(), epochs=1, amp_dtype=torch.bfloat16, ckpt=ckpt)
    # resume() now loads with weights_only=True: the lesson's checkpoint must still load.
    restored = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(restored.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    ns["resume"](restored, opt, scaler, ckpt=ckpt)
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a.cpu(), b)


@pytest.mark.filterwarnings("ignore::UserWarning")  # "CUDA is not available ... Disabling autocast"
@pytest.mark.parametrize("name", ["api/call_forms.in.py", "api/import_styles.in.py"])
def test_rewritten_api_calls_construct_on_cpu(name):
    """Every rewritten autocast / GradScaler call accepts its new arguments (no cuda needed to build)."""
    ns = _load(name)
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    if "run" in ns:
        ns["run"](model, x)
    else:
        ns["step"](model, x)
