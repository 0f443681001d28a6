"""The package's layering: the plugin, the matrix and zero-code mode import one way."""

from __future__ import annotations

import ast
import importlib
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
                target = _import_target(node, base)
                if target.startswith("pytest_modelparity"):
                    found.add(target)
                    found.update(f"{target}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("pytest_modelparity"))
        graph[name] = found
    return {k: {t for t in v if t in graph and t != k} for k, v in graph.items()}


def test_plugin_imports_zero_code_one_way() -> None:
    graph = _module_imports()
    assert "pytest_modelparity.plugin.zero_code" in graph["pytest_modelparity.plugin"]
    assert "pytest_modelparity.plugin" not in graph["pytest_modelparity.plugin.zero_code"]
    assert "pytest_modelparity.plugin" not in graph["pytest_modelparity.plugin.matrix"]


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


# -- the whole package (issue 14) -------------------------------------------------------

def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: name -> (file, is a package)."""
    found = {"pytest_modelparity": (PACKAGE / "__init__.py", True)}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="pytest_modelparity."):
        path = PACKAGE.joinpath(*info.name.split(".")[1:])
        file = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
        if file.exists():
            found[info.name] = (file, info.ispkg)
    return found


def _imports(name: str, file: Path, is_pkg: bool, *, top_level_only: bool) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) of every ``import``/``from`` of the package
    in ``file``; ``top_level_only``: only those run when the module is imported (not inside
    functions, nor under ``if TYPE_CHECKING``)."""
    package = name if is_pkg else name.rpartition(".")[0]
    tree = ast.parse(file.read_text())
    if top_level_only:
        nodes: list[ast.AST] = []
        todo: list[ast.AST] = list(tree.body)
        while todo:
            node = todo.pop()
            nodes.append(node)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo.extend(node.orelse)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                todo.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if target.split(".")[0] == "pytest_modelparity":
                found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names
                         if a.name.split(".")[0] == "pytest_modelparity")
    return found


def test_every_module_imports_and_none_is_part_of_an_import_cycle() -> None:
    """Import every module, then walk the imports each runs at import time (lazy ones inside
    functions are how a module defers a heavy or upward import, and run later): they must
    form no cycle. A parent package is always initialised before its modules, so an import
    of a module's own parent package is no edge."""
    modules = _modules()
    for name in modules:
        importlib.import_module(name)
    graph = _import_graph(modules, top_level_only=True)
    assert _find_cycle(graph) is None, "import cycle: " + " -> ".join(_find_cycle(graph) or [])


def _import_graph(modules: dict[str, tuple[Path, bool]], *, top_level_only: bool) -> dict[str, set[str]]:
    """Module -> the modules among ``modules`` it imports (its own parent package is no edge)."""
    graph: dict[str, set[str]] = {}
    for name, (file, is_pkg) in modules.items():
        edges: set[str] = set()
        for target, names, _ in _imports(name, file, is_pkg, top_level_only=top_level_only):
            edges.update(t for t in (target, *(f"{target}.{n}" for n in names)) if t in modules)
        graph[name] = {t for t in edges if t != name and not name.startswith(t + ".")}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        done.add(node)
        return None

    for name in sorted(graph):
        if name not in done:
            found = visit(name, [name])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def _owner(module: str) -> str | None:
    """The package whose private module ``module`` is (``formats`` for ``formats._tf``), or None."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_modules_private_names() -> None:
    """``from .x import _y`` is a private helper reached from outside its module, and
    ``formats._tf`` imported from outside ``formats`` a private module reached from outside
    its package: both make the helper impossible to change in one place."""
    bad = []
    for name, (file, is_pkg) in _modules().items():
        for target, names, line in _imports(name, file, is_pkg, top_level_only=False):
            bad += [f"{file.name}:{line} imports {n} from {target}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
            owner = _owner(target)
            if owner is not None and name != owner and not name.startswith(owner + "."):
                bad.append(f"{file.name}:{line} imports the private module {target} from outside {owner}")
    assert not bad, "\n".join(bad)


def _import_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, relative imports resolved in ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    root = ".".join(parts[: len(parts) - node.level + 1])
    return f"{root}.{node.module}" if node.module else root


def test_no_two_modules_import_each_other_even_through_lazy_imports() -> None:
    """Anywhere in the package, every import, lazy ones inside functions and those under
    ``if TYPE_CHECKING`` included, points one way: two modules that need each other are one
    concept cut in two (``exports/cache`` <-> ``floor_cache`` and ``verdict/scanning`` <->
    ``statistics`` were such pairs)."""
    graph = _import_graph(_modules(), top_level_only=False)
    assert _find_cycle(graph) is None, "import cycle: " + " -> ".join(_find_cycle(graph) or [])


# -- the folders are the layers (issue 24) ----------------------------------------------

# Top to bottom: a folder imports only folders below it (lazy imports inside functions
# included). ``tfjs_runner`` is the public command ``python -m pytest_modelparity.tfjs_runner``
# (it calls runtime/tfjs_runner); ``strategies`` is the public module that gathers the batch
# strategies (checks/) and generated models (fuzz/); ``fuzz`` is the converter fuzzing, a room of
# its own above the checks it uses (issue 46); ``errors`` (a module at the top of the package) is
# below all.
LAYERS = ("tfjs_runner", "strategies", "plugin", "fuzz", "checks", "reports", "diagnose", "exports", "floor", "formats", "runtime",
          "verdict", "errors")
# formats/ holds at its top only what every format shares; each runtime family has its folder
# (issue 35), and the twins that measure the noise floor live in floor/, not here.
FORMATS_SHARED = {"__init__", "base", "binding", "common", "_files"}
FORMAT_FAMILIES = {"tensorflow", "tflite", "onnx", "tfjs", "recorded"}
MAX_TOP_LEVEL_MODULES = 6
MAX_MODULE_LINES = 900


def layer_of(module: str) -> str | None:
    """The layer (folder, or ``errors``) a module ``pytest_modelparity.X...`` belongs to; None for
    the package's own ``__init__`` (the public API, which names every layer lazily)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layering_problems(package: Path, name: str = "pytest_modelparity") -> list[str]:
    """Every rule of the layout broken under ``package`` (a directory), one line each: too many
    modules directly in it, a module over ``MAX_MODULE_LINES`` lines, a folder that is no layer,
    an import that points up (or across) between layers, a cycle between folders."""
    problems = []
    top = sorted(p.name for p in package.glob("*.py"))
    if len(top) > MAX_TOP_LEVEL_MODULES:
        problems.append(f"{len(top)} modules directly in {name}/ (at most {MAX_TOP_LEVEL_MODULES}): {top}")
    modules: dict[str, tuple[Path, bool]] = {}
    for file in sorted(package.rglob("*.py")):
        rel = file.relative_to(package).with_suffix("").parts
        is_pkg = rel[-1] == "__init__"
        modules[".".join((name, *rel[:-1]) if is_pkg else (name, *rel))] = (file, is_pkg)
        lines = len(file.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            problems.append(f"{file.relative_to(package)} has {lines} lines (at most {MAX_MODULE_LINES}): split it")
    for folder in sorted(p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if folder not in LAYERS:
            problems.append(f"folder {folder}/ is in no layer: add it to LAYERS and docs/architecture.md")
    for top_module in top:
        stem = top_module[:-3]
        if stem != "__init__" and stem not in LAYERS:
            problems.append(f"module {top_module} sits directly in {name}/ in no layer: move it into a folder")
    problems += _formats_problems(package)
    folders: dict[str, set[str]] = {}
    module_graph: dict[str, set[str]] = {}
    for module, (file, is_pkg) in modules.items():
        here = layer_of(module)
        if here is None:
            continue
        for target, names, line in _imports(module, file, is_pkg, top_level_only=False):
            edges = {t for t in (target, *(f"{target}.{n}" for n in names)) if t in modules}
            module_graph.setdefault(module, set()).update(
                t for t in edges if t != module and not module.startswith(t + "."))
            there = layer_of(target)
            if there is None and names:  # ``from pytest_modelparity import x``: x's layer
                there = next((n for n in names if n in LAYERS), None)
                if there is None:
                    problems.append(f"{file.relative_to(package)}:{line} imports the public API "
                                    f"{names} from inside the package: import the defining module")
                    continue
            if there is None or there == here:
                continue
            folders.setdefault(here, set()).add(there)
            if here not in LAYERS or there not in LAYERS:
                continue
            if LAYERS.index(there) < LAYERS.index(here):
                problems.append(f"{file.relative_to(package)}:{line} imports {target} upward: {here}/ may "
                                f"import only {', '.join(LAYERS[LAYERS.index(here) + 1:])}")
    cycle = _find_cycle(folders)
    if cycle:
        problems.append("import cycle between folders: " + " -> ".join(cycle))
    cycle = _find_cycle(module_graph)
    if cycle:
        problems.append("import cycle between modules: " + " -> ".join(c.removeprefix(name + ".") for c in cycle))
    return problems


def _formats_problems(package: Path) -> list[str]:
    """formats/: only the shared modules at its top, only known runtime families below it, no
    twin anywhere in it."""
    formats = package / "formats"
    if not formats.is_dir():
        return []
    problems = [f"formats/{f.name} sits at the top of formats/ but is not shared by every format: move it into "
                f"its runtime's folder ({', '.join(sorted(FORMAT_FAMILIES))})"
                for f in sorted(formats.glob("*.py")) if f.stem not in FORMATS_SHARED]
    problems += [f"formats/{d.name}/ is no runtime family: add it to FORMAT_FAMILIES and docs/architecture.md"
                 for d in sorted(formats.iterdir()) if (d / "__init__.py").exists() and d.name not in FORMAT_FAMILIES]
    problems += [f"{f.relative_to(package)} is a twin: twins live in floor/"
                 for f in sorted(formats.rglob("*twin*.py"))]
    return problems


def test_the_package_keeps_its_layout() -> None:
    assert layering_problems(PACKAGE) == []


def _planted(tmp_path: Path) -> Path:
    """A copy of the package's layout (every folder, empty modules) to plant faults in."""
    root = tmp_path / "pytest_modelparity"
    for file in PACKAGE.rglob("*.py"):
        dest = root / file.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text('"""stand-in"""\n')
    return root


def test_the_layout_check_sees_a_planted_upward_import(tmp_path: Path) -> None:
    root = _planted(tmp_path)
    assert layering_problems(root) == []
    (root / "runtime" / "devices.py").write_text("def f():\n    from ..formats import import_tf\n")
    problems = layering_problems(root)
    assert len(problems) == 1 and "runtime/devices.py:2 imports pytest_modelparity.formats upward" in problems[0]
    (root / "formats" / "base.py").write_text("from ..runtime import devices\n")
    assert any("cycle between folders" in p for p in layering_problems(root))


def test_the_layout_check_sees_a_planted_long_module_and_a_loose_one(tmp_path: Path) -> None:
    root = _planted(tmp_path)
    (root / "verdict" / "compare.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert layering_problems(root) == [f"verdict/compare.py has {MAX_MODULE_LINES + 1} lines "
                                       f"(at most {MAX_MODULE_LINES}): split it"]
    (root / "verdict" / "compare.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert layering_problems(root) == []
    (root / "helpers.py").write_text("x = 1\n")
    assert layering_problems(root) == ["module helpers.py sits directly in pytest_modelparity/ in no layer: "
                                       "move it into a folder"]
    for i in range(MAX_TOP_LEVEL_MODULES):
        (root / f"errors{i}.py").write_text("x = 1\n")
    assert any("modules directly in pytest_modelparity/" in p for p in layering_problems(root))


def test_the_layout_check_sees_a_planted_cycle_inside_a_folder(tmp_path: Path) -> None:
    root = _planted(tmp_path)
    (root / "verdict" / "scanning.py").write_text("from .statistics import Stats\n")
    assert layering_problems(root) == []
    (root / "verdict" / "statistics.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                      "    from .scanning import Scanner\n")
    assert layering_problems(root) == ["import cycle between modules: verdict.scanning -> verdict.statistics -> "
                                       "verdict.scanning"]


def test_the_layout_check_sees_a_format_outside_its_family_and_a_twin_in_formats(tmp_path: Path) -> None:
    root = _planted(tmp_path)
    (root / "formats" / "tflite_quant.py").write_text("x = 1\n")
    (root / "formats" / "tfjs" / "graph_twin.py").write_text("x = 1\n")
    (root / "formats" / "coreml").mkdir()
    (root / "formats" / "coreml" / "__init__.py").write_text("x = 1\n")
    problems = layering_problems(root)
    assert len(problems) == 3
    assert problems[0].startswith("formats/tflite_quant.py sits at the top of formats/")
    assert problems[1].startswith("formats/coreml/ is no runtime family")
    assert problems[2] == "formats/tfjs/graph_twin.py is a twin: twins live in floor/"


def test_no_test_file_is_named_after_an_issue() -> None:
    """A test file says what it tests: ``test_export_messages_26.py`` said when it was written."""
    import re

    named = [f.name for f in Path(__file__).parent.rglob("test_*.py") if re.search(r"_\d+\.py$", f.name)]
    assert not named, f"test files named after an issue number: {named}"
