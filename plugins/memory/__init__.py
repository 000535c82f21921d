"""Built-in plugin ``memory``: in-process saver, event store, stream bridge, run store and history cache.

Nothing here outlives the process; use it for tests and single-process development.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runstore.hookspecs import hookimpl

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.registry import (
        EventStoreRegistry,
        HistoryCacheRegistry,
        RunStoreRegistry,
        SaverRegistry,
        StreamBridgeRegistry,
    )
    from runstore.urls import BackendURL

    from .cache import MemoryHistoryCache
    from .events import MemoryEventStore
    from .runs import MemoryRunStore
    from .saver import MemorySaver
    from .streams import MemoryStreamBridge


async def _open_saver(url: BackendURL, options: BackendOptions) -> MemorySaver:
    from .saver import MemorySaver

    return await MemorySaver.open(url, options)


async def _open_events(url: BackendURL, options: BackendOptions) -> MemoryEventStore:
    from .events import MemoryEventStore

    return await MemoryEventStore.open(url, options)


async def _open_streams(url: BackendURL, options: BackendOptions) -> MemoryStreamBridge:
    from .streams import MemoryStreamBridge

    return await MemoryStreamBridge.open(url, options)


async def _open_runs(url: BackendURL, options: BackendOptions) -> MemoryRunStore:
    from .runs import MemoryRunStore

    return await MemoryRunStore.open(url, options)


async def _open_history_cache(url: BackendURL, options: BackendOptions) -> MemoryHistoryCache:
    from .cache import MemoryHistoryCache

    return await MemoryHistoryCache.open(url, options)


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory=_open_saver,
        capabilities=[
            "copy_thread",
            "prune",
            "delete_for_runs",
            "delta_history",
            "sync_api",
            "thread_index",
            "retention",
            "fencing",
            "typed_filters",
            "global_list_order",
            "checked_ids",
        ],
        description="in-process checkpoint saver",
    )


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory=_open_events,
        capabilities=["fencing"],
        description="in-process event store with per-thread indexes",
    )


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory=_open_streams,
        capabilities=["replay", "fencing"],
        description="in-process stream bridge",
    )


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory=_open_runs,
        capabilities=[],
        description="in-process run store (the SQL run store's rules on a private in-memory db)",
    )


@hookimpl
def runstore_register_history_caches(registry: HistoryCacheRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory=_open_history_cache,
        description="in-process LRU cache of delta history",
    )
