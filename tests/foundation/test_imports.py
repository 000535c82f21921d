"""The house rules of runstore's imports, checked on the source (docs/architecture.md).

* No import cycles between the modules that ship, counting imports inside functions and
  under ``if TYPE_CHECKING:`` too: a deferred or type-only import that closes a cycle still
  ties the two modules together (each needs the other to be understood or changed). A
  module's import of its own package is not counted (Python has imported it first anyway).
* The kind wings (``runstore.checkpoint``, ``.events``, ``.streams``, ``.runs``) are
  mutually independent: what two kinds share lives in a module of its own.
* No runtime module imports the tools (``runstore.cli``, ``runstore.bench``), the
  conformance suite or a plugin; no kind wing imports plugin discovery (the loader).
* Configuration (``runstore.settings``) does not import plugin discovery.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> the package it ships as (pyproject's package-dir).
PACKAGES = {"core": "runstore", "plugins": "runstore.plugins", "conformance": "runstore.conformance"}
WINGS = ("runstore.checkpoint", "runstore.events", "runstore.streams", "runstore.runs", "runstore.store")
TOOLS = ("runstore.cli", "runstore.bench", "runstore.conformance", "runstore.__main__")
#: Modules that exist to keep old import paths working; they name every new home.
COMPATIBILITY = {"runstore", "runstore.moved"}


def modules() -> dict[str, Path]:
    """Every shipped module's dotted name -> its source file."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


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
    """Each shipped module -> the shipped modules it imports, wherever the import sits."""
    return {module: set(targets) for module, targets in _graph().items()}


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(name, path, node):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return {name: frozenset(targets) for name, targets in graph.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _wing(module: str) -> str | None:
    return next((wing for wing in WINGS if _within(module, wing)), None)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a contract of the module docstring, as readable lines."""
    found = []
    for module, targets in sorted(graph.items()):
        if module in COMPATIBILITY:
            continue
        runtime = not any(_within(module, tool) for tool in TOOLS) and not _within(module, "runstore.plugins")
        for target in sorted(targets):
            wing, other = _wing(module), _wing(target)
            if wing and other and wing != other:
                found.append(f"{module} -> {target}: the kind wings are independent")
            if runtime and any(_within(target, tool) for tool in TOOLS):
                found.append(f"{module} -> {target}: runtime code does not import the tools or the suite")
            if runtime and _within(target, "runstore.plugins"):
                found.append(f"{module} -> {target}: core does not import a plugin")
            if (wing or module == "runstore.settings") and target == "runstore.loader":
                found.append(f"{module} -> {target}: kinds and configuration do not discover plugins")
    return found


def test_no_import_cycles() -> None:
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_check_sees_a_cycle() -> None:
    graph = import_graph()
    graph["runstore.errors"].add("runstore.urls")  # urls imports errors
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


def test_the_import_contracts_hold() -> None:
    assert violations(import_graph()) == []


@pytest.mark.parametrize(
    ("module", "target", "rule"),
    [
        ("runstore.events.protocol", "runstore.runs.protocol", "wings are independent"),
        ("runstore.streams.sse", "runstore.cli.console", "does not import the tools"),
        ("runstore.checkpoint.rules", "runstore.plugins.sqlite.saver", "does not import a plugin"),
        ("runstore.settings", "runstore.loader", "do not discover plugins"),
    ],
)
def test_each_contract_sees_its_violation(module: str, target: str, rule: str) -> None:
    graph = import_graph()
    graph[module].add(target)
    assert any(rule in line for line in violations(graph))


def test_every_shipped_module_is_named_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [name for name in sorted(modules()) if f"`{name}`" not in page and name not in COMPATIBILITY]
    assert missing == [], f"docs/architecture.md does not name: {', '.join(missing)}"


def test_no_shipped_module_is_over_800_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert long == {}, f"split these modules: {long}"
