"""No import circle inside ampkit.diagnose, counting imports inside functions (TYPE_CHECKING blocks aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import ampkit.diagnose

PKG = "ampkit.diagnose"
ROOT = Path(ampkit.diagnose.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every ampkit.diagnose module ``path`` imports, at any depth, except under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_ImportFrom(self, node):
            if node.module and node.module.startswith(PKG):
                found.add(node.module)
                for alias in node.names:  # `from ampkit.diagnose import runner`
                    if (ROOT / f"{alias.name}.py").exists() and node.module == PKG:
                        found.add(f"{PKG}.{alias.name}")

        def visit_Import(self, node):
            found.update(a.name for a in node.names if a.name.startswith(PKG))

    Visitor().visit(ast.parse(path.read_text()))
    return found


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in ROOT.glob("*.py"):
        name = PKG if path.stem == "__init__" else f"{PKG}.{path.stem}"
        graph[name] = _imports(path) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for dep in graph.get(node, ()):
                if dep == start:
                    found.append(path + [start])
                elif dep not in seen and dep in graph and dep != PKG:
                    seen.add(dep)
                    stack.append((dep, path + [dep]))
    return found


def test_no_import_cycle_in_diagnose():
    graph = _graph()
    assert f"{PKG}.instrument" in graph and f"{PKG}.casts" in graph["ampkit.diagnose.instrument"]
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_function_level_import(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"], ["b", "a", "b"]]
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ampkit.diagnose.runner import R\n"
                     "def f():\n    from ampkit.diagnose.instrument import X\n")
    assert _imports(probe) == {"ampkit.diagnose.instrument"}
