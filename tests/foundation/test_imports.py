"""No import cycles between the modules that ship, counting imports inside functions too.

A deferred import that closes a cycle still ties the two modules together (each needs
the other to be understood or changed), so a cycle is refused wherever the import sits.
Imports under ``if TYPE_CHECKING:`` do not run and are not counted, nor is a module's
import of its own package (Python has imported that package first anyway).
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> the package it ships as (pyproject's package-dir).
PACKAGES = {"core": "runstore", "plugins": "runstore.plugins", "conformance": "runstore.conformance"}


def _modules() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """Each shipped module -> the shipped modules it imports at run time."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(name, path, node):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def test_no_import_cycles() -> None:
    graph = import_graph()
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_check_sees_a_cycle() -> None:
    graph = import_graph()
    graph["runstore.errors"].add("runstore.urls")  # urls imports errors
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError:
        return
    raise AssertionError("a cycle between runstore.errors and runstore.urls went unnoticed")
