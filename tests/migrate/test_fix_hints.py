"""Fix hints name the file's own variables and keep the user's own arguments (issue 15): the golden
files pin line:code only, so the texts are checked here."""

from __future__ import annotations

from ampkit.migrate import migrate_source

SCALER = """import torch

def step(model, x, args):
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp, init_scale=2.0**10)
    with torch.cuda.amp.autocast(args.amp):
        return model(x), scaler
"""


def _fix(result, code: str, line: int) -> str:
    (f,) = [f for f in result.findings if f.code == code and f.line == line]
    return f.fix


def test_deprecated_api_hint_keeps_the_users_arguments():
    r = migrate_source(SCALER)
    assert _fix(r, "deprecated-amp-api", 4).startswith(
        "torch.amp.GradScaler(device_type, enabled=args.amp, init_scale=2.0**10)  # device_type:")
    assert _fix(r, "deprecated-amp-api", 5).startswith(
        "torch.amp.autocast(device_type, enabled=args.amp, dtype=torch.float16)  # device_type:")
    assert "device.type" not in _fix(r, "deprecated-amp-api", 4)


def test_hard_coded_device_hint_after_fix_keeps_them_too():
    fixed = migrate_source(SCALER).new_code
    r = migrate_source(fixed)
    assert [f.code for f in r.findings] == ["hard-coded-device", "hard-coded-device"]
    assert r.findings[0].fix.startswith("torch.amp.GradScaler(device_type, enabled=args.amp, init_scale=2.0**10)")


def test_host_sync_hint_names_the_loop_counter_and_the_value():
    code = """import torch

def train(model, loader, opt):
    for it, (x, y) in enumerate(loader):
        out = model(x)
        opt.step()
        print(out.sum().item())
        if not torch.isfinite(out).all():
            continue
"""
    r = migrate_source(code)
    item = _fix(r, "host-sync-per-step", 7)
    assert "out.sum().detach()" in item and "if it % log_every == 0" in item
    assert "torch.isfinite(out)" in _fix(r, "host-sync-per-step", 8)


def test_unsafe_load_hint_shows_the_safe_alternatives():
    r = migrate_source("import torch\nckpt = torch.load(path, map_location='cpu')\n")
    fix = _fix(r, "unsafe-torch-load", 2)
    assert fix.startswith("torch.load(path, map_location='cpu', weights_only=True)")
    assert "torch.serialization.add_safe_globals" in fix and "state_dict()" in fix
    assert not r.changed  # not provably a state dict: reported, never rewritten
