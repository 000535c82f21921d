"""Broken store: it keeps per-put TTLs but ignores the ``TTLConfig`` it was opened with
(``default_ttl``, ``refresh_on_read``), so items put without a ``ttl`` never expire.
The store suite must fail it (contract: an item put without a ttl is gone default_ttl
minutes after its put)."""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    index, _ttl = store_config(options)
    return MemoryStore(index=index)  # BUG (on purpose): the TTLConfig is dropped


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add("broken-store-ttl-config-ignored", schemes=["broken-store-ttl-config-ignored"], factory=_open,
                 capabilities=STORE_CAPABILITIES)
