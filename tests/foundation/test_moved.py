"""Old import paths and names keep working for one release, and say where they went."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import runstore
from runstore import moved


@pytest.mark.parametrize(("old", "new"), sorted(moved.MODULES.items()))
def test_an_old_module_path_is_the_new_module_with_a_warning(old: str, new: str) -> None:
    code = (
        "import warnings, importlib, sys\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import runstore\n"
        f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as exc:\n"
        "    print('WARNED', exc)\n"
        "warnings.simplefilter('ignore')\n"
        f"print(importlib.import_module({old!r}) is importlib.import_module({new!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"WARNED {old} has moved to {new}" in out.stdout, out.stdout + out.stderr
    assert out.stdout.strip().endswith("True"), out.stdout


def test_every_new_home_exists() -> None:
    for new in moved.MODULES.values():
        importlib.import_module(new)


@pytest.mark.parametrize(("old", "new"), sorted(moved.RENAMED.items()))
def test_a_renamed_name_is_the_new_object_with_a_warning(old: str, new: str) -> None:
    module_name, _, old_name = old.rpartition(".")
    new_module, _, new_name = new.rpartition(".")
    assert new_module == module_name, "a rename stays in its module"
    module = importlib.import_module(module_name)
    with pytest.warns(DeprecationWarning, match=f"{old} is renamed {new}"):
        value = getattr(module, old_name)
    assert value is getattr(module, new_name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(module, new_name)  # the new name never warns
    with pytest.raises(AttributeError):
        module.NoSuchName  # noqa: B018


@pytest.mark.parametrize("name", sorted(runstore._FORMER))
def test_a_former_top_level_name_still_resolves_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"import it from {runstore._FORMER[name]}"):
        value = getattr(runstore, name)
    assert value is getattr(importlib.import_module(runstore._FORMER[name]), name)


def test_the_public_face_is_curated() -> None:
    assert len(runstore.__all__) <= 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in runstore.__all__:
            getattr(runstore, name)


def test_every_exception_is_importable_from_errors() -> None:
    errors = importlib.import_module("runstore.errors")
    for name in [*runstore.__all__, *runstore._FORMER]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            value = getattr(runstore, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert getattr(errors, name) is value, name


def test_every_exception_class_is_defined_in_errors() -> None:
    """A runtime module raises exceptions from `runstore.errors`; it defines none of its own
    (private signals that never leave their module excepted)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # Control-flow signals caught inside runstore, never raised to a caller: DryRun rolls
    # a sweep's transaction back carrying its answer; UnstorableJSONError is the codec's
    # refusal, which the metadata and filter checks raise as InvalidSaverInputError.
    signals = {"DryRun", "UnstorableJSONError"}
    defined = []
    for folder in ("core", "plugins"):
        for path in (root / folder).rglob("*.py"):
            if (path.name == "errors.py" and path.parent.name == "core") or "bench" in path.parts:
                continue  # the tools' own input errors stay with the tools
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                bases = [ast.unparse(b) for b in getattr(node, "bases", [])]
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and node.name not in signals and any(b.endswith(("Error", "Exception")) for b in bases):
                    defined.append(f"{path.relative_to(root)}: {node.name}")
    assert defined == []


@pytest.mark.parametrize("name", ["run_sync", "ensure_off_loop"])
def test_a_sync_twin_helper_moved_out_of_the_checkpoint_wing_still_resolves(name: str) -> None:
    """Every kind's sync twins use them, so they live in `runstore.twins` now."""
    import runstore.checkpoint.rules as rules
    import runstore.twins as twins

    with pytest.warns(DeprecationWarning, match=f"runstore.checkpoint.rules.{name} has moved to runstore.twins.{name}"):
        value = getattr(rules, name)
    assert value is getattr(twins, name)
