"""Broken store: a batch runs op by op, each checked when its turn comes, so the puts
and deletes ahead of a bad op are applied before the batch fails. The store suite must
fail it (contract: a batch with one bad op writes nothing)."""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL


class OpByOpStore(MemoryStore):
    def batch(self, ops: Any) -> list[Any]:
        results = []
        for op in ops:  # BUG (on purpose): each op checked and applied on its own
            results.extend(super().batch([op]))
        return results

    async def abatch(self, ops: Any) -> list[Any]:
        results = []
        for op in ops:  # BUG (on purpose): each op checked and applied on its own
            results.extend(await super().abatch([op]))
        return results


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return OpByOpStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add("broken-store-batch-op-by-op", schemes=["broken-store-batch-op-by-op"], factory=_open,
                 capabilities=STORE_CAPABILITIES)
