"""Old import paths and names that still work for one release, with a `DeprecationWarning`.

runstore's modules were regrouped into one sub-package per kind (``runstore.events``,
``runstore.streams``, ``runstore.runs``, ``runstore.checkpoint``) with shared rules in
modules of their own (``runstore.fencing``, ``runstore.clock``, ``runstore.validation``,
``runstore.batching``) and the tools in ``runstore.cli``. `MODULES` maps each old module
path to its new home; importing an old path warns and gives the new module itself, so
``isinstance`` checks and monkeypatching see one object. `moved_attribute` does the same
for a name that left a module which still exists, and `renamed_attribute` for a name
renamed in its module (`RENAMED`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

#: old module path -> the module that holds its contents now
MODULES: Mapping[str, str] = {
    "runstore.records": "runstore.events.records",
    "runstore.identity": "runstore.events.identity",
    "runstore.owner": "runstore.events.owner",
    "runstore.sql.events": "runstore.events.sql",
    "runstore.sql.schema": "runstore.events.schema",
    "runstore.sse": "runstore.streams.sse",
    "runstore.sql.runs": "runstore.runs.sql",
    "runstore.retention": "runstore.sweeper",
    "runstore.retention_cli": "runstore.cli.retention",
    "runstore.check": "runstore.cli.check",
    "runstore.scaffold": "runstore.cli.scaffold",
    "runstore.console": "runstore.cli.console",
    "runstore.checkpoint.groupcommit": "runstore.batching",
    "runstore.checkpoint.saverbase": "runstore.checkpoint.rules",
    "runstore.checkpoint.retention": "runstore.checkpoint.policy",
    "runstore.plugins.postgres.pooled": "runstore.plugins.postgres.pooler_functions",
}

#: "module.OldName" -> "module.NewName": names renamed where they stand
RENAMED: Mapping[str, str] = {
    "runstore.batching.GroupCommit": "runstore.batching.BatchQueue",
    "runstore.plugins.postgres.connections.Leases": "runstore.plugins.postgres.connections.PostgresCalls",
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} has moved to {new}; the old path is removed in the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        _warn(module.__name__, self.new, stacklevel=8)
        # The import system returns what sys.modules holds once this returns: the new
        # module itself, not a copy of its names.
        sys.modules[module.__name__] = importlib.import_module(self.new)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of `MODULES` and loads their new modules under them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import runstore`` calls this)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def moved_attribute(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (name -> new module) with a warning."""

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(f"{module}.{name}", f"{new}.{name}", stacklevel=3)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def renamed_attribute(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the former names `RENAMED` lists for ``module``
    (the new object itself) with a warning."""
    names = {
        old.rpartition(".")[2]: new.rpartition(".")[2]
        for old, new in RENAMED.items()
        if old.rpartition(".")[0] == module
    }

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is renamed {module}.{new}; the old name is removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return __getattr__
