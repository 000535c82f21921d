"""pluggy hook specifications: the contract between runstore and its backend plugins.

A plugin module implements any of these with ``@hookimpl`` (this module's) and is listed
under the ``runstore`` entry-point group of its distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from runstore.registry import (
        EventStoreRegistry,
        HistoryCacheRegistry,
        RunStoreRegistry,
        SaverRegistry,
        SettingsRegistry,
        StoreRegistry,
        StreamBridgeRegistry,
    )
    from runstore.urls import BackendURL

PROJECT = "runstore"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def runstore_register_savers(registry: SaverRegistry) -> None:
    """Add LangGraph checkpoint saver backends to ``registry``."""


@hookspec
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    """Add run event store backends to ``registry``."""


@hookspec
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    """Add stream bridge backends to ``registry``."""


@hookspec
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    """Add run store backends (runs, leases, one active run per thread) to ``registry``."""


@hookspec
def runstore_register_history_caches(registry: HistoryCacheRegistry) -> None:
    """Add delta-history cache backends (``checkpoint_cache.type``) to ``registry``."""


@hookspec
def runstore_register_stores(registry: StoreRegistry) -> None:
    """Add long-term memory stores (LangGraph ``BaseStore``: namespaced items, search, TTL)
    to ``registry``."""


@hookspec
def runstore_register_settings(registry: SettingsRegistry) -> None:
    """Declare the plugin's settings sections in ``registry`` (`SettingsRegistry.add`)."""


@hookspec(firstresult=True)
def runstore_conformance_provision(
    url: BackendURL,
) -> AbstractAsyncContextManager[BackendURL] | None:
    """Return an async context manager that yields an isolated URL for a conformance session.

    The manager creates a fresh database, schema, directory or key space for ``url``
    on entry and drops it on exit. Return ``None`` when ``url`` is not yours.
    """
