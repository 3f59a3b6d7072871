"""The library surface: migrate_source / migrate_paths, errors, and the write guarantees."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

import ampkit.migrate.files as files
import ampkit.migrate.rules.grad_scaler as grad_scaler
from ampkit.errors import AmpkitError, UsageError
from ampkit.migrate import Finding, SourceSyntaxError, atomic_write, migrate_paths, migrate_source

OLD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def test_migrate_source_result():
    r = migrate_source(OLD, filename="t.py")
    assert r.changed and r.new_code == 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
    assert [f.code for f in r.findings] == ["deprecated-amp-api"]
    f = r.findings[0]
    assert isinstance(f, Finding) and f.where() == "t.py:2" and f.rewritten
    with pytest.raises(AttributeError):
        f.line = 3  # frozen


def test_unchanged_source_is_returned_as_is():
    code = "x = 1  # nothing to do\n"
    r = migrate_source(code)
    assert not r.changed and r.new_code is code and r.findings == ()


def test_syntax_error_is_a_usage_error():
    with pytest.raises(SourceSyntaxError, match="does not parse") as exc:
        migrate_source("def f(:\n", filename="bad.py")
    assert isinstance(exc.value, UsageError) and exc.value.exit_code == 2


@pytest.mark.parametrize("kw", [{"target": "rocm"}, {"select": ["nope"]}])
def test_bad_options(kw):
    with pytest.raises(UsageError):
        migrate_source(OLD, **kw)


def test_migrate_paths_without_fix_writes_nothing_and_prints_nothing(tmp_path, capsys):
    f = tmp_path / "a.py"
    f.write_text(OLD)
    (result,) = migrate_paths([tmp_path])
    assert result.changed and not result.written and result.diff.startswith("--- ")
    assert f.read_text() == OLD
    assert capsys.readouterr() == ("", "")


def test_output_that_does_not_parse_is_never_written(tmp_path, monkeypatch):
    """A rule bug that produced invalid code is caught before anything is written."""
    def broken(call, arg):  # a repeated keyword parses with libcst but not with Python
        dup = cst.Arg(keyword=cst.Name("enabled"), value=cst.Name("True"))
        return call.with_changes(args=[dup.with_changes(comma=cst.Comma()), dup])

    monkeypatch.setattr(grad_scaler, "prepend_arg", broken)
    f = tmp_path / "a.py"
    f.write_text(OLD)
    (result,) = migrate_paths([f], fix=True)
    assert result.error and "does not parse" in result.error and not result.written
    assert f.read_text() == OLD
    with pytest.raises(AmpkitError):
        migrate_source(OLD)


def test_atomic_write_failure_keeps_the_original(tmp_path, monkeypatch):
    f = tmp_path / "a.py"
    f.write_text(OLD)

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(OSError):
        atomic_write(str(f), "new")
    assert f.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_write_error_is_reported_per_file(tmp_path, monkeypatch):
    f = tmp_path / "a.py"
    f.write_text(OLD)
    monkeypatch.setattr(files, "atomic_write", lambda *args: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    (result,) = migrate_paths([f], fix=True)
    assert result.error == f"{f}: cannot write (Permission denied)"
    assert f.read_text() == OLD


def test_non_utf8_file_is_an_error(tmp_path):
    f = tmp_path / "latin.py"
    f.write_bytes(b"# caf\xe9\nx = 1\n")
    (result,) = migrate_paths([f], fix=True)
    assert result.error == f"{f}: not valid utf-8 (byte 5); skipped. If the file uses another encoding, " \
        "declare it on line 1: # -*- coding: NAME -*-"
    assert f.read_bytes() == b"# caf\xe9\nx = 1\n"


def test_bom_is_kept(tmp_path):
    f = tmp_path / "bom.py"
    f.write_bytes(b"\xef\xbb\xbf" + OLD.encode())
    (result,) = migrate_paths([f], fix=True)
    assert result.written and f.read_bytes().startswith(b"\xef\xbb\xbfimport torch\n")


def test_file_without_final_newline_diffs_cleanly(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(OLD.rstrip("\n"))
    (result,) = migrate_paths([f])
    assert "\\ No newline at end of file" in result.diff
    assert Path(f).read_text() == OLD.rstrip("\n")


def test_paths_are_deduplicated(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(OLD)
    assert len(migrate_paths([f, str(f), tmp_path])) == 1
