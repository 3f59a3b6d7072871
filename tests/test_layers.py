"""The package map of docs/contributing.md, enforced: what each package may import, no import circles,
and a package root of at most eight modules.

Imports are read from the source with ``ast``: module-level imports and imports inside functions (lazy
ones) both count; only ``if TYPE_CHECKING:`` blocks are left out, since they never run.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "ampkit"

# Each part of the design and the parts it may import (besides itself). The leaves (errors, choices,
# findings, compat) sit under everything; data flows one way: cli -> features -> engine -> device.
LEAVES = {"errors", "choices", "findings", "compat", "atomic", "children"}
MAY_IMPORT = {
    "errors": set(),
    "atomic": set(),
    "children": set(),  # the processes ampkit starts: tied to its life
    "choices": set(),
    "findings": set(),
    "compat": {"errors"},
    "_moved": set(),
    "__init__": {"_moved"},
    "__main__": {"cli"},
    "device": LEAVES | {"__init__"},  # __init__: only for ampkit.__version__
    "tasks": LEAVES,
    "engine": LEAVES | {"device"},
    "distributed": LEAVES | {"device", "tasks"},
    "checkpoint": LEAVES | {"device", "distributed"},
    "training": LEAVES | {"device", "engine", "checkpoint", "distributed", "tasks"},
    "migrate": LEAVES,  # no torch-heavy part: `ampkit migrate` runs without loading torch's stack
    "diagnose": LEAVES | {"device", "engine", "checkpoint", "training", "tasks"},
    "verify": LEAVES | {"__init__", "device", "engine", "checkpoint", "training", "tasks", "diagnose"},
    "bench": LEAVES | {"__init__", "device", "engine", "tasks", "distributed", "training"},
    "parity": LEAVES | {"device", "diagnose"},
    "cli": None,  # the top: may import anything
}


def _modules() -> dict[str, pathlib.Path]:
    return _modules_under(SRC, ROOT)


@functools.lru_cache(maxsize=4)
def _modules_under(src: pathlib.Path, root: pathlib.Path) -> dict[str, pathlib.Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.AST]) -> None:
        for node in nodes:
            if _is_type_checking(node):
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] == "ampkit":
                    for alias in node.names:
                        sub = f"{target}.{alias.name}"
                        found.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "ampkit")
            else:
                visit(list(ast.iter_child_nodes(node)))

    visit(ast.parse(path.read_text()).body)
    found.discard(name)
    return {m for m in found if m in mods}


def _graph() -> dict[str, set[str]]:
    return _graph_under(SRC, ROOT)


@functools.lru_cache(maxsize=4)
def _graph_under(src: pathlib.Path, root: pathlib.Path) -> dict[str, set[str]]:
    mods = _modules_under(src, root)
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_the_package_root_keeps_at_most_eight_modules():
    root = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root) <= 8, root


def test_every_part_is_in_the_map():
    parts = {_part(m) for m in _modules()}
    assert parts <= set(MAY_IMPORT), parts - set(MAY_IMPORT)


@pytest.mark.parametrize("part", sorted(k for k, v in MAY_IMPORT.items() if v is not None))
def test_each_part_imports_only_what_the_map_allows(part):
    allowed = MAY_IMPORT[part] | {part}
    wrong = sorted(f"{src} imports {dst}" for src, dsts in _graph().items() if _part(src) == part
                   for dst in dsts if _part(dst) not in allowed)
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            connect(v)
    assert not circles, circles


def test_the_checker_sees_a_circle_and_a_lazy_import(tmp_path, monkeypatch):
    """The two rules above must be able to fail: a planted circle through a lazy import is found."""
    pkg = tmp_path / "ampkit"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "a.py").write_text("from ampkit.engine import b\n")
    (pkg / "engine" / "b.py").write_text("def f():\n    from ampkit.engine.a import x\n    import ampkit.cli\n")
    (pkg / "cli.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    graph = _graph()
    assert graph["ampkit.engine.b"] == {"ampkit.engine.a", "ampkit.cli"}
    assert graph["ampkit.engine.a"] == {"ampkit.engine.b"}
    with pytest.raises(AssertionError):
        test_no_import_circles()
    with pytest.raises(AssertionError):
        test_each_part_imports_only_what_the_map_allows("engine")
