"""Broken store: a search page after the first starts one item early, so consecutive pages
repeat an item. The store suite must fail it (contract: search pages ... never repeat an
item)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from langgraph.store.base import SearchItem

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store import Search
from runstore.store.base import store_config
from runstore.urls import BackendURL


class PagingRepeatsStore(MemoryStore):
    def _search(self, op: Search, query: Any, now: datetime) -> list[SearchItem]:
        # BUG (on purpose): an off-by-one offset on every page but the first (each page
        # still has as many items as it should).
        if op.offset == 0:
            return super()._search(op, query, now)
        total = len(super()._search(Search(op.prefix, op.conditions, op.query, 10**9, 0, False), query, now))
        count = max(0, min(op.limit, total - op.offset))
        shifted = Search(op.prefix, op.conditions, op.query, count, op.offset - 1, op.refresh_ttl)
        return super()._search(shifted, query, now)

async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return PagingRepeatsStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add('broken-store-paging-repeats', schemes=['broken-store-paging-repeats'], factory=_open, capabilities=STORE_CAPABILITIES)
