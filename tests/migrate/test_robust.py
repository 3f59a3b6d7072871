"""`ampkit migrate` over whole folders: no traceback ever, one line per skipped file, the token
pre-check, worker processes, encodings, line ends and --json (issue 18; the edge cases of issue 15)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.migrate import engine, migrate_paths, migrate_source
from ampkit.migrate.rules.base import Rule

SRC = Path(__file__).resolve().parents[2] / "src"
FIXTURES = Path(__file__).parent / "fixtures"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
OLD = "import torch\n\ndef step(model, x, ckpt):\n    with torch.cuda.amp.autocast():\n        return model(x)\n"
# 500 implicitly concatenated strings: Python compiles it, libcst's metadata recurses too deep.
# 600 implicitly concatenated strings nest 600 deep in libcst's tree, in a statement a rule reads
DEEP = "import torch\nm = torch.load(\n" + "'a'\n" * 600 + ")\n"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ampkit", "migrate", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ampkit migrate: error: ")]


def test_standard_library_sweep_changes_nothing_and_never_tracebacks():
    """The whole installed standard library, as a user would point migrate at a big folder."""
    start = time.perf_counter()
    proc = _run(str(STDLIB))
    seconds = time.perf_counter() - start
    print(f"stdlib sweep: {seconds:.1f} s")  # shown with -s; the figure goes into the report
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert proc.stdout == ""  # no diff, no finding
    summary = proc.stderr.strip().splitlines()[-1]
    assert " 0 would change, 0 finding(s)" in summary, summary
    checked = int(summary.split()[0])
    assert checked > 500, summary  # it really walked the standard library
    errors = _error_lines(proc.stderr)
    # Every other stderr line is a skipped file: one line, naming a file under the folder.
    assert len(errors) == len(proc.stderr.strip().splitlines()) - 1
    for line in errors:
        assert line.split("error: ", 1)[1].startswith(str(STDLIB)), line
    assert proc.returncode == (2 if errors else 0)


def test_pydoc_topics_named_directly_is_parsed_without_traceback():
    # The 739 KB dict literal that took the whole run down (issue 18): named, it is always parsed.
    topics = STDLIB / "pydoc_data" / "topics.py"
    if not topics.exists():
        pytest.skip("this Python has no pydoc_data/topics.py")
    proc = _run(str(topics))
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 2), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_too_deep_file_is_one_line_and_the_others_are_still_migrated(tmp_path, capsys):
    deep = tmp_path / "deep.py"
    deep.write_text(DEEP)
    good = tmp_path / "good.py"
    good.write_text(OLD)
    assert main(["migrate", "--fix", "--jobs", "1", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [f"ampkit migrate: error: {deep}: nested too deeply to analyse (RecursionError); "
                                 "left untouched"]
    assert "Traceback" not in err and "1 skipped" in err
    assert deep.read_text() == DEEP
    assert "torch.amp.autocast" in good.read_text()


def test_memory_error_and_rule_bugs_become_one_line(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text(OLD)
    (tmp_path / "b.py").write_text(OLD)

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(engine, "_migrate", out_of_memory)
    a, b = migrate_paths([tmp_path], jobs=1)
    assert a.error == f"{tmp_path / 'a.py'}: out of memory while analysing; left untouched"
    assert b.error and not b.changed

    monkeypatch.undo()
    from ampkit.migrate.rules.autocast import AutocastRule

    def bug(self, node):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(AutocastRule, "visit_Module", bug)
    (res,) = migrate_paths([tmp_path / "a.py"])
    assert res.error == (f"{tmp_path / 'a.py'}: internal error in AutocastRule (RuntimeError: boom); file left "
                         "untouched. Please report this with the file.")


def test_worker_processes_give_the_same_results_as_one(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURES, corpus, ignore=shutil.ignore_patterns("*.out.py"))  # the inputs are enough
    (corpus / "deep.py").write_text(DEEP)
    one = migrate_paths([corpus], target="musa", jobs=1)
    two = migrate_paths([corpus], target="musa", jobs=2)
    assert one == two
    assert sum(r.analysed for r in one) >= 15 and any(r.error for r in one)


def test_precheck_never_hides_a_finding_or_rewrite(monkeypatch):
    """Every rule's words are a superset of what it matches: with the pre-check switched off,
    every fixture migrates exactly the same (each with the options its first line asks for)."""
    from tests.migrate.test_golden import options

    cases = sorted(FIXTURES.glob("**/*.in.py"))
    sources = {case: case.read_text(encoding="utf-8") for case in cases}
    with_check = {case: migrate_source(src, **options(src)) for case, src in sources.items()}
    monkeypatch.setattr(Rule, "may_match", classmethod(lambda cls, text, target: True))
    for case, src in sources.items():
        assert migrate_source(src, **options(src)) == with_check[case], case


# The least a rule must see: each snippet alone in a folder (so the pre-check applies) still gets
# its finding or rewrite. Import aliases are where a word list goes too narrow.
SNIPPETS = {
    "load_by_name": ("from torch import load\nx = load(p)\n", "unsafe-torch-load"),
    "torch_aliased": ("import torch as th\nx = th.load(p)\n", "unsafe-torch-load"),
    "amp_module": ("from torch.cuda import amp\nwith amp.autocast():\n    pass\n", None),
    "amp_via_cuda": ("import torch\nfrom torch import cuda\ns = cuda.amp.GradScaler()\n", "deprecated-amp-api"),
    "scaler_helper": ("def f(loader, loss_scaler, opt, m):\n    for x in loader:\n        loss = m(x)\n"
                      "        loss_scaler(loss, opt)\n        print(loss.item())\n", "host-sync-per-step"),
    "clip": ("def f(s, l, o, p):\n    s.scale(l).backward()\n    clip_grad_norm_(p, 1.0)\n    s.step(o)\n",
             "clip-before-unscale"),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_precheck_lets_the_smallest_matches_through(tmp_path, name):
    code, expected = SNIPPETS[name]
    (tmp_path / "snippet.py").write_text(code)
    (res,) = migrate_paths([tmp_path], jobs=1)
    assert res.analysed, name
    if expected is None:
        assert res.changed, name
    else:
        assert expected in {f.code for f in res.findings}, res.findings


def test_folder_files_without_the_words_are_not_parsed_named_ones_are(tmp_path):
    (tmp_path / "plain.py").write_text("def f(:\n")  # broken, but nothing migrate looks for
    assert [(r.analysed, r.error) for r in migrate_paths([tmp_path])] == [(False, None)]
    (named,) = migrate_paths([tmp_path / "plain.py"])
    assert named.analysed and "does not parse" in named.error


def test_latin1_file_is_read_and_written_in_its_declared_encoding(tmp_path, capsys):
    f = tmp_path / "legacy.py"
    before = ("# -*- coding: latin-1 -*-\n# café\n" + OLD).encode("latin-1")
    f.write_bytes(before)
    assert main(["migrate", "--fix", str(f)]) == 1
    after = f.read_bytes()
    assert after == before.replace(b"torch.cuda.amp.autocast()", b'torch.amp.autocast("cuda")')
    assert b"caf\xe9" in after  # still latin-1, not UTF-8


@pytest.mark.parametrize("head,error", [
    (b"# -*- coding: klingon -*-\n", "cannot decode (unknown encoding: klingon); skipped"),
    # Python gives no line for a NUL byte: the message has none (it said `:None:`)
    (b"import torch\x00\n", "does not parse (source code string cannot contain null bytes); left untouched"),
])
def test_unreadable_file_is_one_line(tmp_path, capsys, head, error):
    f = tmp_path / "odd.py"
    f.write_bytes(head + OLD.encode())
    assert main(["migrate", str(f)]) == 2
    assert _error_lines(capsys.readouterr().err) == [f"ampkit migrate: error: {f}: {error}"]


def test_lone_cr_at_the_end_is_kept_and_the_diff_applies(tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.skip("git is needed to apply the diff")
    f = tmp_path / "mac.py"
    before = OLD.encode() + b"x = torch.cuda.amp.GradScaler()\r"
    f.write_bytes(before)
    (res,) = migrate_paths([f])
    assert res.new_code.endswith('x = torch.amp.GradScaler("cuda")\r')
    assert all(line.endswith("\n") for line in res.diff.splitlines(keepends=True))
    patch = tmp_path / "change.diff"
    patch.write_text(res.diff, newline="")
    subprocess.run(["git", "apply", "--unsafe-paths", "--directory", "", "-p0", str(patch)], cwd="/",
                   check=True, capture_output=True)
    assert f.read_bytes() == res.new_code.encode()


def test_empty_select_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "t.py"
    f.write_text(OLD)
    assert main(["migrate", "--select", "", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--select names no code" in err[0]


def test_json_output_schema(tmp_path, capsys):
    good = tmp_path / "a.py"
    good.write_text(OLD + "ckpt = torch.load(path)\n")
    bad = tmp_path / "b.py"
    bad.write_text("import torch\ndef f(:\n")
    assert main(["migrate", "--json", str(good), str(bad)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert [set(o) for o in out] == [{"path", "changed", "written", "analysed", "error", "diff", "findings"}] * 2
    a, b = out
    assert a["path"] == str(good) and a["changed"] and not a["written"] and a["error"] is None
    assert a["diff"].startswith(f"--- {good}\n")
    assert {f["code"] for f in a["findings"]} == {"deprecated-amp-api", "unsafe-torch-load"}
    for f in a["findings"]:
        assert set(f) == {"code", "message", "where", "line", "fix", "rewritten", "kind"}
        assert f["where"] == f"{good}:{f['line']}"
    assert b["error"].startswith(f"{bad}:2: does not parse") and b["findings"] == [] and b["diff"] == ""


def test_jobs_must_be_positive(tmp_path, capsys):
    assert main(["migrate", "--jobs", "0", str(tmp_path)]) == 2
    assert "--jobs must be 1 or more" in capsys.readouterr().err
