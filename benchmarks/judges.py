"""How right are ampkit's judges on code nobody here wrote: diagnose and migrate over the standing corpus.

    PYTHONPATH=src python benchmarks/judges.py [--fast] [--only diagnose|migrate] [--out FILE]

The corpus is ``tests/judges/corpus/`` (how to add a case: docs/contributing.md, "The judges' corpus"):

* ``diagnose/``: CPU training scripts modelled on public repositories, each with a truth table entry in
  ``diagnose/cases.json``: planted defects with the code and line diagnose should name, and clean code
  (their clean twins, and the attention/normalisation/loss code of well-known repositories) on which
  diagnose should say nothing. Each script is run by ``python -m ampkit diagnose --json`` in a fresh
  process, so whatever ``ampkit`` is importable (PYTHONPATH) is what gets measured.
* ``migrate/``: CUDA-specific files with a truth table per ``--target`` in ``migrate/cases.json``: lines
  that must be ported, reported, left alone. Each file is copied to a temporary folder and rewritten by
  ``python -m ampkit migrate --fix --json --target T``; the rewrite is compared with the original line by line.

Figures: for diagnose, false findings on clean cases, and right code / right line / missed on planted
defects; for migrate, per target, right / reported-not-ported / wrong / missed lines and unexpected
changes. Written to ``benchmarks/results/judges-YYYY-MM-DD.json`` (date, machine, versions, git commit)
and rendered into BENCHMARKS.md by benchmarks/render_benchmarks.py. ``--fast`` runs the cases marked
``fast`` (the subset CI runs through tests/judges/test_judges.py).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "judges" / "corpus"
DIAGNOSE = CORPUS / "diagnose"
MIGRATE = CORPUS / "migrate"
RESULTS = ROOT / "benchmarks" / "results"
MIGRATE_EXPECT = ("port", "report", "report-only", "keep", "free")
TIMEOUT_S = 600


class CorpusError(Exception):
    """A truth table that does not fit its corpus (a missing file, a bad entry)."""


# ---------------------------------------------------------------------------------------------- truth tables
def load_diagnose_cases(fast: bool = False) -> list[dict]:
    """The diagnose truth table (``diagnose/cases.json``), checked: every file exists, planted cases expect
    at least one ``{code, line}`` and clean cases none."""
    cases = json.loads((DIAGNOSE / "cases.json").read_text(encoding="utf-8"))["cases"]
    for case in cases:
        if not (DIAGNOSE / case["file"]).is_file():
            raise CorpusError(f"diagnose case {case['name']}: no file {case['file']}")
        if case["kind"] not in ("planted", "clean") or (case["kind"] == "planted") != bool(case["expect"]):
            raise CorpusError(f"diagnose case {case['name']}: kind {case['kind']!r} with expect {case['expect']}")
        for item in case["expect"]:
            if not (isinstance(item.get("code"), str) and isinstance(item.get("line"), int)):
                raise CorpusError(f"diagnose case {case['name']}: expect needs code and line, got {item}")
    return [c for c in cases if c.get("fast")] if fast else cases


def load_migrate_cases(fast: bool = False) -> tuple[list[dict], dict[str, str]]:
    """The migrate truth table (``migrate/cases.json``) and its ``absent`` pattern per target, checked: each
    row's ``text`` is part of its line."""
    doc = json.loads((MIGRATE / "cases.json").read_text(encoding="utf-8"))
    for entry in doc["files"]:
        path = MIGRATE / entry["file"]
        if not path.is_file():
            raise CorpusError(f"migrate case: no file {entry['file']}")
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, rows in entry["targets"].items():
            if target not in doc["absent"]:
                raise CorpusError(f"{entry['file']}: unknown target {target!r}")
            for row in rows:
                if row["expect"] not in MIGRATE_EXPECT:
                    raise CorpusError(f"{entry['file']}:{row['line']}: expect {row['expect']!r} not in {MIGRATE_EXPECT}")
                if not 1 <= row["line"] <= len(lines) or row["text"] not in lines[row["line"] - 1]:
                    raise CorpusError(f"{entry['file']}:{row['line']}: the line does not contain {row['text']!r}")
    files = [e for e in doc["files"] if e.get("fast")] if fast else doc["files"]
    return files, doc["absent"]


# ---------------------------------------------------------------------------------------------- running
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def plain_run(case: dict, timeout: float = TIMEOUT_S) -> dict:
    """``python FILE`` as a user would run it: ``{"rc", "judge", "stderr_tail"}`` where ``judge`` is the
    script's ``JUDGE`` line (finite loss, defect observed) or None when it printed none."""
    proc = subprocess.run([sys.executable, case["file"]], cwd=DIAGNOSE, capture_output=True, text=True,
                          timeout=timeout, env=_env())
    judge = None
    for line in proc.stdout.splitlines():
        if line.startswith("JUDGE "):
            judge = json.loads(line[len("JUDGE "):])
    return {"rc": proc.returncode, "judge": judge, "stderr_tail": proc.stderr[-2000:]}


def run_diagnose(case: dict, timeout: float = TIMEOUT_S) -> dict:
    """``python -m ampkit diagnose --json`` on one case: ``{"rc", "findings", "seconds", "error"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "findings.json"
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "ampkit", "diagnose", "--json", str(out), case["file"]],
                                  cwd=DIAGNOSE, capture_output=True, text=True, timeout=timeout, env=_env())
        except subprocess.TimeoutExpired:
            return {"rc": None, "findings": [], "seconds": timeout, "error": f"timed out after {timeout:.0f} s"}
        seconds = time.perf_counter() - start
        error = None
        findings: list[dict] = []
        if out.is_file():
            findings = json.loads(out.read_text(encoding="utf-8"))
        elif proc.returncode not in (0, 3):
            error = f"no JSON written (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-300:]}"
    return {"rc": proc.returncode, "findings": findings, "seconds": round(seconds, 2), "error": error}


def run_migrate(entry: dict, target: str, timeout: float = TIMEOUT_S) -> dict:
    """``python -m ampkit migrate --fix --json --target TARGET`` on a copy of one file:
    ``{"rc", "before", "after", "findings", "seconds", "error"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / entry["file"]
        shutil.copyfile(MIGRATE / entry["file"], copy)
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "ampkit", "migrate", "--fix", "--json", "--target", target,
                                   "--jobs", "1", copy.name], cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout, env=_env())
        except subprocess.TimeoutExpired:
            return {"rc": None, "after": None, "findings": [], "seconds": timeout,
                    "error": f"timed out after {timeout:.0f} s"}
        seconds = time.perf_counter() - start
        before = (MIGRATE / entry["file"]).read_text(encoding="utf-8")
        after = copy.read_text(encoding="utf-8")
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"rc": proc.returncode, "before": before, "after": after, "findings": [], "seconds": seconds,
                    "error": f"no JSON on stdout (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    findings = [f for file_report in report for f in file_report.get("findings", [])]
    errors = [r["error"] for r in report if r.get("error")]
    return {"rc": proc.returncode, "before": before, "after": after, "findings": findings,
            "seconds": round(seconds, 2), "error": "; ".join(errors) or None}


# ---------------------------------------------------------------------------------------------- scoring
_WHERE = re.compile(r"([\w./\\-]+\.py):(\d+)")


def finding_line(where: str, file: str) -> int | None:
    """The line of ``file`` a finding's ``where`` names (``model.attn · x.py:29`` -> 29), else None."""
    for name, line in _WHERE.findall(where.split(" · ", 1)[-1]):
        if os.path.basename(name) == file:
            return int(line)
    return None


def score_diagnose(case: dict, findings: list[dict]) -> dict:
    """One case's outcome. Clean: ``false_findings`` (the findings made). Planted, per expected defect:
    ``right`` (code at the expected line), ``right-code`` (code elsewhere), ``wrong-code`` (findings, none
    with the code), ``missed`` (no finding); ``extra``: findings whose code no expectation names."""
    got = [{"code": f.get("code"), "line": finding_line(str(f.get("where", "")), case["file"])} for f in findings]
    if case["kind"] == "clean":
        return {"false_findings": len(got), "found": got}
    outcomes = []
    for want in case["expect"]:
        same = [g for g in got if g["code"] == want["code"]]
        if any(g["line"] == want["line"] for g in same):
            outcomes.append("right")
        elif same:
            outcomes.append("right-code")
        else:
            outcomes.append("wrong-code" if got else "missed")
    codes = {w["code"] for w in case["expect"]}
    return {"outcomes": outcomes, "extra": sum(g["code"] not in codes for g in got), "found": got}


def changed_lines(before: str, after: str) -> dict[int, str]:
    """Original line number -> what it became (``""`` when deleted). In a block replaced by a block of
    another length, each old line goes, in order, to the most similar new line left; the new lines no old
    line takes (an added import) are insertions and belong to no original line."""
    old, new = before.splitlines(), after.splitlines()
    out: dict[int, str] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal" or tag == "insert":
            continue
        if tag == "delete":
            out.update({i + 1: "" for i in range(i1, i2)})
        elif i2 - i1 == j2 - j1:
            out.update({i1 + k + 1: new[j1 + k] for k in range(i2 - i1)})
        else:
            j = j1
            for i in range(i1, i2):
                left = i2 - i - 1  # old lines still to place: keep a new line for each when there are enough
                candidates = range(j, max(j + 1, j2 - left)) if j < j2 else range(0)
                if not candidates:
                    out[i + 1] = ""
                    continue
                best = max(candidates, key=lambda c: difflib.SequenceMatcher(None, old[i], new[c]).ratio())
                out[i + 1], j = new[best], best + 1
    return {line: text for line, text in out.items() if text != old[line - 1]}  # a line placed as it was


def score_migrate(rows: list[dict], absent: str, before: str, after: str, findings: list[dict]) -> dict:
    """One file and target. Each truth row gets ``right`` / ``reported`` (a port line reported but not
    rewritten) / ``wrong`` / ``missed``; ``unexpected``: changed lines the table does not list."""
    changed = changed_lines(before, after)
    reported = {f.get("line") for f in findings if isinstance(f.get("line"), int)}
    pattern = re.compile(absent)
    result = []
    for row in rows:
        line, expect = row["line"], row["expect"]
        is_changed, is_reported = line in changed, line in reported
        if expect == "free":
            continue
        if expect == "port":
            if is_changed:
                outcome = "wrong" if pattern.search(changed[line]) else "right"
            else:
                outcome = "reported" if is_reported else "missed"
        elif expect == "report":
            outcome = "right" if is_reported else "missed"
        elif expect == "report-only":
            outcome = "wrong" if is_changed else ("right" if is_reported else "missed")
        else:  # keep
            outcome = "wrong" if is_changed or is_reported else "right"
        result.append({"line": line, "expect": expect, "outcome": outcome,
                       "after": changed.get(line) if is_changed else None})
    listed = {row["line"] for row in rows}
    unexpected = sorted(line for line in changed if line not in listed)
    return {"rows": result, "unexpected": unexpected}


# ---------------------------------------------------------------------------------------------- summary
def summarise_diagnose(results: list[dict]) -> dict:
    clean = [r for r in results if r["kind"] == "clean"]
    planted = [o for r in results if r["kind"] == "planted" for o in r["score"]["outcomes"]]
    return {
        "clean_cases": len(clean),
        "clean_with_findings": sum(r["score"]["false_findings"] > 0 for r in clean),
        "false_findings": sum(r["score"]["false_findings"] for r in clean),
        "planted_defects": len(planted),
        "right_code": sum(o in ("right", "right-code") for o in planted),
        "right_line": planted.count("right"),
        "wrong_code": planted.count("wrong-code"),
        "missed": planted.count("missed"),
        "extra_findings_on_planted": sum(r["score"]["extra"] for r in results if r["kind"] == "planted"),
        "harness_errors": sum(r["error"] is not None for r in results),
        "seconds": round(sum(r["seconds"] or 0 for r in results), 1),
    }


def diagnose_summaries(results: list[dict]) -> dict:
    """``diagnose`` over the corpus and ``diagnose_held_out`` over the held-out cases (written after the code they
    judge was finished, scored before any change for them), counted apart; None where there are none."""
    seen = [r for r in results if not r.get("held_out")]
    held = [r for r in results if r.get("held_out")]
    return {"diagnose": summarise_diagnose(seen) if seen else None,
            "diagnose_held_out": summarise_diagnose(held) if held else None}


def summarise_migrate(results: list[dict]) -> dict:
    out = {}
    for target in sorted({r["target"] for r in results}):
        rows = [row for r in results if r["target"] == target for row in r["score"]["rows"]]
        out[target] = {"files": sum(r["target"] == target for r in results), "lines": len(rows),
                       **{k: sum(row["outcome"] == k for row in rows) for k in ("right", "reported", "wrong", "missed")},
                       "unexpected_changes": sum(len(r["score"]["unexpected"]) for r in results if r["target"] == target),
                       "harness_errors": sum(r["error"] is not None for r in results if r["target"] == target)}
    return out


def _versions() -> dict:
    """Versions as the measured processes see them (a fresh interpreter with this environment)."""
    probe = ("import json, platform, torch, ampkit, libcst\n"
             "try:\n    import transformers; tf = transformers.__version__\nexcept ImportError:\n    tf = None\n"
             "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, "
             "'ampkit': getattr(ampkit, '__version__', None), 'ampkit_path': ampkit.__file__, "
             "'libcst': getattr(libcst, '__version__', None), 'transformers': tf}))")
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), timeout=300)
        return json.loads(proc.stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError):
        return {"python": platform.python_version()}


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


def measure(fast: bool = False, only: str | None = None, progress=None) -> dict:
    """Run the judges over the corpus and return the result record (not yet written)."""
    say = progress or (lambda _msg: None)
    commit, started = _git_commit(), datetime.datetime.now(datetime.timezone.utc)
    diagnose, migrate = [], []
    if only in (None, "diagnose"):
        for case in load_diagnose_cases(fast):
            run = run_diagnose(case)
            score = score_diagnose(case, run["findings"])
            diagnose.append({"name": case["name"], "kind": case["kind"], "expect": case["expect"],
                             "held_out": bool(case.get("held_out")),
                             "repo": case["source"]["repo"], "rc": run["rc"], "error": run["error"],
                             "seconds": run["seconds"], "score": score,
                             "findings": [{k: f.get(k) for k in ("code", "where", "message")} for f in run["findings"]]})
            say(f"diagnose {case['name']}: {score.get('outcomes', score.get('false_findings'))} ({run['seconds']} s)")
    if only in (None, "migrate"):
        files, absent = load_migrate_cases(fast)
        for entry in files:
            for target, rows in entry["targets"].items():
                run = run_migrate(entry, target)
                score = (score_migrate(rows, absent[target], run["before"], run["after"], run["findings"])
                         if run["after"] is not None else {"rows": [], "unexpected": []})
                migrate.append({"file": entry["file"], "target": target, "repo": entry["source"]["repo"],
                                "rc": run["rc"], "error": run["error"], "seconds": run["seconds"], "score": score})
                counts = {k: sum(r["outcome"] == k for r in score["rows"]) for k in ("right", "reported", "wrong", "missed")}
                say(f"migrate {entry['file']} --target {target}: {counts}, unexpected {score['unexpected']}")
    return {
        "kind": "judges",
        "date": started.isoformat(timespec="seconds"),
        "git_commit": commit,
        "machine": platform.node(), "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "versions": _versions(),
        "subset": "fast" if fast else "full",
        "command": "python benchmarks/judges.py" + (" --fast" if fast else "") + (f" --only {only}" if only else ""),
        "summary": {**diagnose_summaries(diagnose), "migrate": summarise_migrate(migrate) if migrate else None},
        "diagnose": diagnose,
        "migrate": migrate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the cases marked fast (what CI runs)")
    parser.add_argument("--only", choices=("diagnose", "migrate"), help="run one judge")
    parser.add_argument("--out", help="result file (default benchmarks/results/judges-YYYY-MM-DD.json; "
                                      "'-' for stdout only)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    try:
        record = measure(args.fast, args.only, None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    except (CorpusError, OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"judges: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(record, indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out) if args.out else RESULTS / f"judges-{record['date'][:10]}.json"
    out.write_text(text, encoding="utf-8")
    print(json.dumps(record["summary"], indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
