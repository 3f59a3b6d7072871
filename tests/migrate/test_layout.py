"""The migrate package has no import cycle, counting imports inside functions and under ``TYPE_CHECKING``
(issue 27: context used to import amp_refs and device_resolve inside functions, and they it)."""

from __future__ import annotations

import ast
from pathlib import Path

import ampkit.migrate

PACKAGE = Path(ampkit.migrate.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["ampkit", "migrate", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:  # `from ampkit.migrate import engine` names a module too
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & known


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(ast.parse(path.read_text()), set(files)) - {name} for name, path in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := dfs(start)):
            return found
    return None


def test_no_import_cycle_in_migrate():
    graph = _graph()
    assert "ampkit.migrate.context" in graph and graph["ampkit.migrate.engine"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_check_sees_function_level_imports():
    tree = ast.parse("def f():\n    from ampkit.migrate.amp_refs import analyse\n")
    assert _imports(tree, {"ampkit.migrate.amp_refs"}) == {"ampkit.migrate.amp_refs"}
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
