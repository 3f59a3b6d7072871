"""Mutation testing of ampkit: does the FAST test suite catch a realistic break of the code?

    python benchmarks/mutation.py                        # the realistic mutants (benchmarks/mutants.py)
    python benchmarks/mutation.py --only verify-metric-first-match rotation-total-skips
    python benchmarks/mutation.py --auto checkpoint --limit 20      # operator/constant mutants of a package
    python benchmarks/mutation.py --list                 # what would run, and which tests each one gets

Each mutant is one edit of one file under ``src/ampkit/``: a *realistic* mutant (hand-written in
``benchmarks/mutants.py``: the original snippet, the mutated one, the behaviour it breaks, the tests that
claim that behaviour) or an *automatic* one (``--auto PACKAGE``: a comparison, arithmetic or boolean operator
swapped, an integer constant moved by one, True/False flipped, a ``not`` dropped; one-line expressions only).
The edit is made in a temporary copy of ``src/`` (never in the working tree); the mutant's tests run against
that copy (``PYTHONPATH``, so child processes the tests start import it too) with ``-m 'not slow' -x`` and a
timeout, one mutant at a time (the machine is shared). A mutant is *killed* when the tests fail (or time out),
*survived* when they pass. Before the mutants, each test selection runs once on the unmodified copy: a
selection that fails there would kill every mutant for nothing, so its mutants are reported ``baseline-fails``
and not counted.

Writes ``benchmarks/results/mutation-YYYY-MM-DD.json`` (``--auto``: ``mutation-auto-PACKAGE-YYYY-MM-DD.json``):
the kill rate per package and in all, the survivors, each mutant's status, time and first failing test, with
date, machine, versions and git commit. Exit 0 when the kill rate reaches ``--bar`` (default 0.95), else 1.
"""

from __future__ import annotations

import argparse
import ast
import copy
import datetime as _dt
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

#: The fast tests that guard each package, for automatic mutants (a realistic mutant names its own).
PACKAGE_TESTS: dict[str, list[str]] = {
    "checkpoint": ["tests/test_checkpoint_rotation.py", "tests/test_checkpoint.py", "tests/test_checkpoint_resume.py"],
    "engine": ["tests/test_engine_guards.py", "tests/test_engine.py", "tests/test_engine_schedulers.py"],
    "training": ["tests/test_train_stop_handlers.py", "tests/test_train.py"],
    "verify": ["tests/verify/test_script_compare_fast.py", "tests/verify/test_interrupt.py",
               "tests/verify/test_judge.py", "tests/verify/test_band.py"],
    "diagnose": ["tests/verify/test_script_compare_fast.py", "tests/diagnose/test_replay.py"],
    "migrate": ["tests/migrate/test_skeleton.py", "tests/migrate/test_golden.py"],
}


@dataclass
class Mutant:
    """One edit of ``file`` (relative to ``src/ampkit``): ``original`` -> ``mutated`` (exactly one occurrence,
    or the one on ``line`` for automatic mutants); ``breaks``: the behaviour it breaks; ``tests``: pytest args."""

    id: str
    file: str
    original: str
    mutated: str
    breaks: str
    tests: list[str] = field(default_factory=list)
    line: int | None = None
    col: tuple[int, int] | None = None  # byte offsets of ``original`` in ``line`` (automatic mutants)

    @property
    def package(self) -> str:
        head = self.file.split("/")[0]
        return head[:-3] if head.endswith(".py") else head


# ------------------------------------------------------------------------------ applying one mutant
def mutate_text(text: str, m: Mutant) -> str:
    """``text`` with the mutant's edit made; ValueError when its original is not where it says."""
    if m.line is None:
        count = text.count(m.original)
        if count != 1:
            raise ValueError(f"{m.id}: the original snippet occurs {count} times in {m.file} (must be once)")
        return text.replace(m.original, m.mutated, 1)
    lines = text.split("\n")
    raw = lines[m.line - 1].encode("utf-8")
    a, b = m.col
    if raw[a:b].decode("utf-8") != m.original:
        raise ValueError(f"{m.id}: line {m.line} of {m.file} no longer holds {m.original!r}")
    lines[m.line - 1] = (raw[:a] + m.mutated.encode("utf-8") + raw[b:]).decode("utf-8")
    return "\n".join(lines)


def _write_fresh(path: Path, text: str) -> None:
    """Write ``text`` so that no stale bytecode of the file's earlier text can be imported: a one-character
    mutant keeps the size and may keep the mtime second, which is all a .pyc is checked against."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()
    path.write_text(text, encoding="utf-8")
    now = time.time()
    os.utime(path, (now, now))


def run_tests(tests: list[str], src: Path, timeout_s: float) -> tuple[str, float, str]:
    """``(status, seconds, first failure)``: ``passed`` / ``failed`` / ``timeout`` / ``no-tests``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]))
    argv = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
            "--no-header", "-rf"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the tests' own children too
        proc.communicate()
        return "timeout", time.perf_counter() - t0, ""
    except BaseException:  # Ctrl-C / SIGTERM of the runner: its test run (a session of its own) goes with it
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    wall = time.perf_counter() - t0
    failed = next((ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    status = {0: "passed", 1: "failed", 5: "no-tests"}.get(proc.returncode, "failed")
    if proc.returncode not in (0, 1, 5) and not failed:
        failed = (out.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return status, wall, failed[:300]


def _check_imports_copy(src: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(src))
    got = subprocess.run([sys.executable, "-c", "import ampkit; print(ampkit.__file__)"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    if not got.startswith(str(src)):
        raise SystemExit(f"the tests would import ampkit from {got}, not from the mutated copy {src}")


# ------------------------------------------------------------------------------ automatic mutants
_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Add: ast.Sub,
         ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.And: ast.Or, ast.Or: ast.And}


def _variants(node: ast.AST) -> list[ast.AST]:
    out = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _SWAP:
                new = copy.deepcopy(node)
                new.ops[i] = _SWAP[type(op)]()
                out.append(new)
    elif isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAP:
        new = copy.deepcopy(node)
        new.op = _SWAP[type(node.op)]()
        out.append(new)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(copy.deepcopy(node.operand))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append(ast.Constant(not node.value))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        out.append(ast.Constant(node.value + 1))
    return out


def auto_mutants(package: str) -> list[Mutant]:
    """Every one-line operator/constant mutant of the package's files (docstrings, f-strings and
    annotations left alone)."""
    base = SRC / "ampkit"
    target = base / package  # a package folder, one file (checkpoint/rotation.py) or a module name (errors)
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target if target.suffix == ".py" else
                                                                  base / f"{package}.py"]
    if not all(f.is_file() for f in files):
        raise SystemExit(f"--auto {package}: no such package or file under src/ampkit")
    tests = PACKAGE_TESTS.get(package.split("/")[0].removesuffix(".py"), [])
    found: list[Mutant] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        skip: set[int] = set()  # f-strings and annotations: no behaviour to break there
        for node in ast.walk(tree):
            parts = [node] if isinstance(node, ast.JoinedStr) else \
                [getattr(node, a, None) for a in ("annotation", "returns")]
            skip.update(id(n) for part in parts if isinstance(part, ast.AST) for n in ast.walk(part))
        for node in ast.walk(tree):
            if id(node) in skip or getattr(node, "lineno", None) is None or node.lineno != node.end_lineno:
                continue
            segment = ast.get_source_segment(text, node)
            if segment is None:
                continue
            for new in _variants(node):
                rel = path.relative_to(base).as_posix()
                n = len([m for m in found if m.file == rel and m.line == node.lineno])
                found.append(Mutant(id=f"auto:{rel}:{node.lineno}:{n}", file=rel, original=segment,
                                    mutated=ast.unparse(new), breaks=f"{segment} -> {ast.unparse(new)}", tests=tests,
                                    line=node.lineno, col=(node.col_offset, node.end_col_offset)))
    return found


# ------------------------------------------------------------------------------ the run
def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "pytest", "libcst"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def summarize(results: list[dict], bar: float) -> dict:
    """Kill rate per package and in all (mutants whose tests failed on the unmodified code not counted)."""
    counted = [r for r in results if r["status"] in ("killed", "timeout", "survived")]
    packages: dict[str, dict] = {}
    for r in counted:
        p = packages.setdefault(r["package"], {"mutants": 0, "killed": 0, "timeouts": 0, "survived": 0})
        p["mutants"] += 1
        p[{"killed": "killed", "timeout": "timeouts", "survived": "survived"}[r["status"]]] += 1
    for p in packages.values():
        p["kill_rate"] = round((p["killed"] + p["timeouts"]) / p["mutants"], 4)
    killed = sum(p["killed"] + p["timeouts"] for p in packages.values())
    rate = round(killed / len(counted), 4) if counted else None
    total = {"mutants": len(counted), "killed": killed, "kill_rate": rate, "not_counted": len(results) - len(counted),
             "bar": bar}
    total["meets_bar"] = total["kill_rate"] is not None and total["kill_rate"] >= bar
    return {"packages": dict(sorted(packages.items())), "total": total,
            "survivors": [{k: r[k] for k in ("id", "file", "breaks", "tests")} for r in results
                          if r["status"] == "survived"]}


def _baseline_groups(selections: list[tuple[str, ...]]) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """One baseline run per set of test files: the union of its selections (``-k A or B``; the whole files
    when one selection takes them whole), so a shared machine runs each file's baseline once."""
    by_files: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for sel in dict.fromkeys(selections):
        files = tuple(a for i, a in enumerate(sel) if a != "-k" and (i == 0 or sel[i - 1] != "-k"))
        by_files.setdefault(files, []).append(sel)
    groups = {}
    for files, sels in by_files.items():
        ks = [sel[sel.index("-k") + 1] if "-k" in sel else None for sel in sels]
        group = files if None in ks else (*files, "-k", " or ".join(f"({k})" for k in ks))
        groups[group] = sels
    return groups


def run(mutants: list[Mutant], *, timeout_s: float, bar: float, log=print, save=None) -> dict:
    tmp = tempfile.TemporaryDirectory(prefix="ampkit-mutation-")
    src = Path(tmp.name) / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    try:
        _check_imports_copy(src)
        baseline: dict[tuple[str, ...], tuple[str, str]] = {}
        for group, sels in _baseline_groups([tuple(m.tests) for m in mutants if m.tests]).items():
            status, wall, failed = run_tests(list(group), src, timeout_s)
            baseline.update((sel, (status, failed)) for sel in sels)
            log(f"baseline {status:8s} {wall:6.1f} s  {' '.join(group)}" + (f"  {failed}" if failed else ""))
        results = []
        for i, m in enumerate(mutants, 1):
            rec = {"id": m.id, "package": m.package, "file": m.file, "breaks": m.breaks, "tests": m.tests,
                   "line": m.line, "original": m.original, "mutated": m.mutated}
            if not m.tests:
                rec.update(status="no-tests", wall_s=0.0, failed="")
            elif baseline[tuple(m.tests)][0] != "passed":
                rec.update(status="baseline-fails", wall_s=0.0, failed=baseline[tuple(m.tests)][1])
            else:
                path = src / "ampkit" / m.file
                text = path.read_text(encoding="utf-8")
                try:
                    _write_fresh(path, mutate_text(text, m))
                    status, wall, failed = run_tests(m.tests, src, timeout_s)
                finally:
                    _write_fresh(path, text)
                rec.update(status={"failed": "killed", "passed": "survived"}.get(status, status), wall_s=round(wall, 1),
                           failed=failed)
            results.append(rec)
            if save is not None:  # after every mutant: a long run stopped half-way keeps what it measured
                save({"complete": False, "results": results, **summarize(results, bar)})
            log(f"[{i}/{len(mutants)}] {rec['status']:9s} {rec['wall_s']:6.1f} s  {m.id}: {m.breaks}")
    finally:
        tmp.cleanup()
    return {"complete": True, "results": results, **summarize(results, bar)}


def _realistic() -> list:
    from mutants import REALISTIC

    return REALISTIC


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants (ids as --list shows them)")
    ap.add_argument("--auto", metavar="PACKAGE", help="automatic mutants of src/ampkit/PACKAGE (e.g. checkpoint, "
                                                      "or one file: checkpoint/rotation.py)")
    ap.add_argument("--limit", type=int, default=None, help="with --auto: a random sample of this many")
    ap.add_argument("--tests", default=None, metavar="ARGS",
                    help="with --auto: the pytest arguments instead of the package's (PACKAGE_TESTS)")
    ap.add_argument("--seed", type=int, default=0, help="with --auto --limit: the sample's seed")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default 300)")
    ap.add_argument("--bar", type=float, default=0.95, help="the kill rate to reach (default 0.95)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON file (default benchmarks/results/...)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    ap.add_argument("--update", action="store_true",
                    help="keep the other mutants' records of the JSON file and replace those run now (after a "
                         "test was added: --only ID --update)")
    args = ap.parse_args(argv)
    if args.auto:
        mutants = auto_mutants(args.auto)
        if args.tests:
            import shlex

            for m in mutants:
                m.tests = shlex.split(args.tests)
        if args.limit is not None and args.limit < len(mutants):
            mutants = sorted(random.Random(args.seed).sample(mutants, args.limit), key=lambda m: (m.file, m.line))
    else:
        mutants = [m if isinstance(m, Mutant) else Mutant(**m) for m in _realistic()]
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            ap.error(f"unknown mutant ids: {', '.join(sorted(unknown))} (see --list)")
        mutants = [m for m in mutants if m.id in args.only]
    for m in mutants:  # every edit must apply to today's code before anything runs
        try:
            mutate_text((SRC / "ampkit" / m.file).read_text(encoding="utf-8"), m)
        except (ValueError, OSError) as exc:
            ap.error(f"{exc}: update benchmarks/mutants.py")
    if args.list:
        for m in mutants:
            print(f"{m.id:40s} {m.file}: {m.breaks}\n{'':40s} tests: {' '.join(m.tests) or '(none)'}")
        return 0
    t0 = time.perf_counter()
    today = _dt.date.today().isoformat()
    out = args.out or RESULTS / (f"mutation-auto-{args.auto.removesuffix('.py').replace('/', '-')}-{today}.json" if args.auto
                                 else f"mutation-{today}.json")
    head = {"kind": "mutation", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "versions": _versions(),
            "git_commit": _git("rev-parse", "HEAD"), "git_dirty": bool(_git("status", "--porcelain", "--", "src")),
            "mode": f"auto:{args.auto}" if args.auto else "realistic", "timeout_s": args.timeout}

    kept = []
    if args.update and out.is_file():
        ids = {m.id for m in mutants}
        prior = json.loads(out.read_text(encoding="utf-8"))
        # each kept record says which commit it ran on (the file's git_commit becomes this run's)
        kept = [{**r, "git_commit": r.get("git_commit") or prior.get("git_commit")} for r in prior["results"]
                if r["id"] not in ids]

    def save(report: dict) -> dict:
        if kept:
            report["results"] = [{**r, "git_commit": head["git_commit"]} for r in report["results"]]
            order = {m["id"] if isinstance(m, dict) else m.id: i for i, m in enumerate(_realistic())}
            results = sorted(kept + report["results"], key=lambda r: order.get(r["id"], len(order)))
            report = {**report, "results": results, **summarize(results, args.bar)}
        doc = {**head, "wall_s": round(time.perf_counter() - t0, 1), **report}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return doc

    doc = save(run(mutants, timeout_s=args.timeout, bar=args.bar, log=lambda s: print(s, flush=True), save=save))
    t = doc["total"]
    for name, p in doc["packages"].items():
        print(f"{name:12s} {p['killed'] + p['timeouts']}/{p['mutants']} killed ({p['kill_rate']:.0%})")
    print(f"all          {t['killed']}/{t['mutants']} killed ({t['kill_rate'] or 0:.1%}), bar {args.bar:.0%}; "
          f"{t['not_counted']} not counted; written to {out}")
    return 0 if t["meets_bar"] else 1


if __name__ == "__main__":
    sys.exit(main())
