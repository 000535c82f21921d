"""Broken store: reads never refresh an item's TTL, whatever refresh_ttl says. The store
suite must fail it (contract: get returns an item until ttl minutes after its last write
or refreshing read)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL


class NoRefreshStore(MemoryStore):
    @staticmethod
    def _touch(entry: Any, refresh: bool, now: datetime) -> None:
        # BUG (on purpose): the expiry stays where the last write put it.
        return None


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, ttl = store_config(options)
    return NoRefreshStore(index=index, ttl=ttl)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add('broken-store-ttl-no-refresh', schemes=['broken-store-ttl-no-refresh'], factory=_open, capabilities=STORE_CAPABILITIES)
