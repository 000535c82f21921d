"""Broken store: reads hand out the stored value itself, not a copy (what LangGraph's
stock ``InMemoryStore`` does), so a caller mutating a returned value changes the item.
The store suite must fail it (contract: a read returns a fresh copy)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph.store.base import Item

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store import Get
from runstore.store.base import store_config
from runstore.urls import BackendURL


class SharedValuesStore(MemoryStore):
    def _get(self, op: Get, now: datetime) -> Item | None:
        item = super()._get(op, now)
        entry = self._live(op.namespace, op.key, now)
        if item is None or entry is None:
            return item
        # BUG (on purpose): the stored dict itself, not a copy.
        return Item(value=entry.value, key=item.key, namespace=item.namespace,
                    created_at=item.created_at, updated_at=item.updated_at)


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return SharedValuesStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add("broken-store-shared-values", schemes=["broken-store-shared-values"], factory=_open,
                 capabilities=STORE_CAPABILITIES)
