"""Broken store: the search filter ignores nested keys (a dotted path or a nested mapping
matches everything). The store suite must fail it (contract: search returns only live
items ... that match the filter)."""

from __future__ import annotations

from typing import Any

from langgraph.store.base import SearchOp

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL


def _top_level_only(op: Any) -> Any:
    if not isinstance(op, SearchOp) or not op.filter:
        return op
    # BUG (on purpose): conditions on nested keys are dropped.
    kept = {k: v for k, v in op.filter.items() if "." not in k and not (isinstance(v, dict) and not any(
        str(o).startswith("$") for o in v))}
    return op._replace(filter=kept or None)


class NestedFilterStore(MemoryStore):
    def batch(self, ops: Any) -> list[Any]:
        return super().batch([_top_level_only(op) for op in ops])

    async def abatch(self, ops: Any) -> list[Any]:
        return await super().abatch([_top_level_only(op) for op in ops])


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return NestedFilterStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add('broken-store-nested-filter', schemes=['broken-store-nested-filter'], factory=_open, capabilities=STORE_CAPABILITIES)
