"""Broken store: list_namespaces ignores max_depth. The store suite must fail it
(contract: list_namespaces ... cut to max_depth labels)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store import ListNamespaces
from runstore.store.base import store_config
from runstore.urls import BackendURL


class MaxDepthStore(MemoryStore):
    def _list(self, op: ListNamespaces, now: datetime) -> list[tuple[str, ...]]:
        # BUG (on purpose): the namespaces are listed whole.
        return super()._list(ListNamespaces(op.conditions, None, op.limit, op.offset), now)


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return MaxDepthStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add('broken-store-max-depth', schemes=['broken-store-max-depth'], factory=_open, capabilities=STORE_CAPABILITIES)
