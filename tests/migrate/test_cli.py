"""`ampkit migrate` end to end: exit codes, output, --fix, --select, --target, and never-corrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.cli.migrate import TARGET_CHOICES
from ampkit.migrate import TARGETS

SRC = Path(__file__).resolve().parents[2] / "src"

OLD = """import torch

def step(model, x, ckpt):
    with torch.cuda.amp.autocast():
        y = model(x)
    model.load_state_dict(torch.load(ckpt))
    return y
"""
CLEAN = """import torch

def step(model, x, device):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        return model(x)
"""
BROKEN = "def step(:\n    return 1\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path


def test_diff_by_default_and_file_untouched(tmp_path, capsys):
    f = _write(tmp_path / "train.py", OLD)
    assert main(["migrate", str(f)]) == 1
    out = capsys.readouterr().out
    assert '-    with torch.cuda.amp.autocast():' in out
    assert '+    with torch.amp.autocast("cuda"):' in out
    assert "unsafe-torch-load" in out and "deprecated-amp-api" in out
    assert f.read_text() == OLD


def test_clean_file_exits_zero(tmp_path, capsys):
    f = _write(tmp_path / "ok.py", CLEAN)
    assert main(["migrate", str(f)]) == 0
    assert capsys.readouterr().out == ""


def test_fix_writes_and_second_run_is_a_no_op(tmp_path, capsys):
    f = _write(tmp_path / "train.py", OLD)
    os.chmod(f, 0o640)
    assert main(["migrate", "--fix", str(f)]) == 1
    fixed = f.read_text()
    assert 'torch.amp.autocast("cuda")' in fixed and "weights_only=True" in fixed
    assert os.stat(f).st_mode & 0o777 == 0o640  # the mode survives the atomic replace
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temp file left behind
    capsys.readouterr()
    # Nothing left to change; the reminder that the device is hard-coded still shows (issue 15).
    assert main(["migrate", "--fix", str(f)]) == 1
    assert f.read_text() == fixed
    out = capsys.readouterr().out
    assert "rewrote" not in out
    assert [line.split(" ", 2)[1] for line in out.splitlines() if ".py:" in line] == ["hard-coded-device"]
    assert 'torch.amp.autocast(device_type, dtype=torch.float16)' not in out  # no template: the user's call
    assert "fix: torch.amp.autocast(device_type)" in out


def test_unparseable_file_is_reported_and_left_byte_for_byte(tmp_path, capsys):
    bad = _write(tmp_path / "bad.py", BROKEN)
    good = _write(tmp_path / "good.py", OLD)
    before = bad.read_bytes()
    assert main(["migrate", "--fix", str(bad), str(good)]) == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "bad.py:1: does not parse" in error_lines[0]
    assert "Traceback" not in err
    assert bad.read_bytes() == before
    assert "torch.amp.autocast" in good.read_text()  # the other file is still migrated


def test_missing_path_is_an_error(tmp_path, capsys):
    assert main(["migrate", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_select_limits_rules(tmp_path, capsys):
    f = _write(tmp_path / "train.py", OLD)
    assert main(["migrate", "--fix", "--select", "unsafe-torch-load", str(f)]) == 1
    text = f.read_text()
    assert "weights_only=True" in text and "torch.cuda.amp.autocast()" in text
    assert "deprecated-amp-api" not in capsys.readouterr().out


def test_unknown_select_code_is_a_usage_error(tmp_path, capsys):
    f = _write(tmp_path / "train.py", OLD)
    assert main(["migrate", "--select", "no-such-code", str(f)]) == 2
    err = capsys.readouterr().err
    assert "no-such-code" in err and len(err.strip().splitlines()) == 1
    assert f.read_text() == OLD


def test_bad_target_is_rejected_by_argparse(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["migrate", "--target", "rocm", str(tmp_path)])
    assert exc.value.code == 2


def test_cli_targets_match_library():
    assert TARGET_CHOICES == TARGETS


def test_target_musa(tmp_path, capsys):
    f = _write(tmp_path / "train.py", 'import torch\nx = torch.zeros(1).cuda()\ntorch.cuda.synchronize()\n')
    assert main(["migrate", "--fix", "--target", "musa", str(f)]) == 1
    assert f.read_text() == 'import torch\nx = torch.zeros(1).to("musa")\ntorch.musa.synchronize()\n'


def test_fix_writes_only_the_given_paths(tmp_path, capsys):
    given = _write(tmp_path / "proj" / "a.py", OLD)
    nested = _write(tmp_path / "proj" / "pkg" / "b.py", OLD)
    sibling = _write(tmp_path / "other" / "c.py", OLD)
    hidden = _write(tmp_path / "proj" / ".venv" / "d.py", OLD)
    data = _write(tmp_path / "proj" / "notes.txt", OLD)
    outside = _write(tmp_path / "outside" / "e.py", OLD)
    (tmp_path / "proj" / "link.py").symlink_to(outside)
    (tmp_path / "proj" / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    assert main(["migrate", "--fix", str(given), str(nested.parent)]) == 1
    assert "torch.amp.autocast" in given.read_text() and "torch.amp.autocast" in nested.read_text()
    for untouched in (sibling, hidden, data, outside):
        assert untouched.read_text() == OLD, untouched


def test_crlf_line_endings_survive(tmp_path, capsys):
    f = tmp_path / "win.py"
    f.write_bytes(OLD.replace("\n", "\r\n").encode())
    assert main(["migrate", "--fix", str(f)]) == 1
    data = f.read_bytes()
    assert b"torch.amp.autocast" in data and data.count(b"\r\n") == OLD.count("\n")
    assert b"\n" not in data.replace(b"\r\n", b"")


def test_real_subprocess(tmp_path):
    f = _write(tmp_path / "train.py", OLD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "ampkit", "migrate", str(f)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert '+    with torch.amp.autocast("cuda"):' in proc.stdout
    assert "\x1b[" not in proc.stdout  # not a terminal: no colour codes in the diff
    assert "1 would change" in proc.stderr
    assert f.read_text() == OLD


def test_diff_is_coloured_only_on_a_terminal():
    import io

    from rich.console import Console

    from ampkit.cli.migrate import _print_diff

    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old\n+new\n"
    buf = io.StringIO()
    _print_diff(Console(file=buf, force_terminal=True, soft_wrap=True), diff)
    assert "\x1b[" in buf.getvalue() and "+new" in buf.getvalue()


def test_missing_path_is_one_line(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ampkit", "migrate", str(tmp_path / "nope.py")],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


FIXTURES = Path(__file__).parent / "fixtures" / "real_world"


def _copy(tmp_path: Path, *names: str) -> Path:
    for name in names:
        _write(tmp_path / f"{name}.py", (FIXTURES / f"{name}.in.py").read_text())
    return tmp_path


def test_target_musa_says_what_could_not_port(tmp_path, capsys):
    folder = _copy(tmp_path, "yolox_device_count_to_musa", "litgpt_fabric_to_musa", "dcgan_is_cuda_to_musa")
    assert main(["migrate", "--target", "musa", str(folder)]) == 1
    lines = capsys.readouterr().err.splitlines()
    counting = [line for line in lines if line.startswith("could not port (device counting)")]
    framework = [line for line in lines if line.startswith("could not port (framework name)")]
    assert counting == [f"could not port (device counting): 2 in 1 file(s): {folder / 'yolox_device_count_to_musa.py'}:"
                        f"10, {folder / 'yolox_device_count_to_musa.py'}:14"]
    assert len(framework) == 1 and framework[0].startswith("could not port (framework name): 2 in 1 file(s): ")
    assert any(line.startswith("torch_musa 2.7 (the default; --musa-version to change): no `import torch_musa`")
               for line in lines)


def test_musa_version_before_2_1_adds_import_torch_musa(tmp_path, capsys):
    folder = _copy(tmp_path, "musa_tutorial_bert_musa_2_0")
    path = folder / "musa_tutorial_bert_musa_2_0.py"
    assert main(["migrate", "--target", "musa", "--musa-version", "2.0", "--fix", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "torch_musa 2.0 (--musa-version): `import torch_musa` added to 1 file(s)" in err
    assert "import torch\nimport torch_musa  # torch_musa < 2.1 does not load itself\n" in path.read_text()
    assert main(["migrate", "--target", "musa", "--musa-version", "2.0", str(folder)]) == 0  # idempotent


def test_agnostic_prints_no_port_summary(tmp_path, capsys):
    folder = _copy(tmp_path, "yolox_device_count_to_musa")
    main(["migrate", str(folder)])
    assert "could not port" not in capsys.readouterr().err


def test_bad_musa_version_is_one_line(tmp_path):
    folder = _copy(tmp_path, "musa_tutorial_bert_musa_2_0")
    proc = subprocess.run([sys.executable, "-m", "ampkit", "migrate", "--target", "musa", "--musa-version", "two",
                           str(folder)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ampkit migrate: error: --musa-version 'two' is not a version; give the torch_musa release, e.g. 2.0 or 2.7.1"]


def test_cli_musa_defaults_match_library():
    from ampkit.cli import migrate as cli
    from ampkit.migrate.context import AUTOLOAD_MUSA_VERSION, DEFAULT_MUSA_VERSION, parse_musa_version

    assert parse_musa_version(cli.DEFAULT_MUSA_VERSION) == DEFAULT_MUSA_VERSION
    assert parse_musa_version(cli.AUTOLOAD_MUSA_VERSION) == AUTOLOAD_MUSA_VERSION


def test_json_findings_carry_the_kind(tmp_path, capsys):
    import json

    folder = _copy(tmp_path, "litgpt_fabric_to_musa")
    main(["migrate", "--target", "musa", "--json", str(folder)])
    (entry,) = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in entry["findings"]] == ["framework name", "framework name"]
