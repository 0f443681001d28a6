"""The package's layering: the plugin, the matrix and zero-code mode import one way."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest_modelparity

PACKAGE = Path(pytest_modelparity.__file__).parent


def _module_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (lazy imports inside
    functions count too: a cycle through them still ties the two modules together)."""
    graph: dict[str, set[str]] = {}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="pytest_modelparity."):
        name = info.name
        path = PACKAGE.joinpath(*name.split(".")[1:])
        file = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
        if not file.exists():
            continue
        tree = ast.parse(file.read_text())
        base = name if info.ispkg else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    root = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{root}.{node.module}" if node.module else root
                else:
                    target = node.module or ""
                if target.startswith("pytest_modelparity"):
                    found.add(target)
                    found.update(f"{target}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("pytest_modelparity"))
        graph[name] = found
    return {k: {t for t in v if t in graph and t != k} for k, v in graph.items()}


def test_plugin_imports_zero_code_one_way() -> None:
    graph = _module_imports()
    assert "pytest_modelparity.zero_code" in graph["pytest_modelparity.plugin"]
    assert "pytest_modelparity.plugin" not in graph["pytest_modelparity.zero_code"]
    assert "pytest_modelparity.plugin" not in graph["pytest_modelparity.matrix"]


def test_no_import_cycle_among_the_matrix_plugin_and_zero_code() -> None:
    graph = _module_imports()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in graph.get(node, ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    for name in ("plugin", "zero_code", "matrix", "fixtures"):
        module = f"pytest_modelparity.{name}"
        assert not reaches(module, module), f"{module} imports itself through a cycle"
