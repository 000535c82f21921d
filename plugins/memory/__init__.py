"""Built-in plugin ``memory``: in-process saver, event store, stream bridge, run store and history cache.

Nothing here outlives the process; use it for tests and single-process development.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runstore.hookspecs import hookimpl

if TYPE_CHECKING:
    from runstore.registry import (
        EventStoreRegistry,
        HistoryCacheRegistry,
        RunStoreRegistry,
        SaverRegistry,
        StreamBridgeRegistry,
    )


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory="runstore.plugins.memory.saver:MemorySaver.open",
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
        factory="runstore.plugins.memory.events:MemoryEventStore.open",
        capabilities=["fencing", "bulk_import"],
        description="in-process event store with per-thread indexes",
    )


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory="runstore.plugins.memory.streams:MemoryStreamBridge.open",
        capabilities=["replay", "fencing"],
        description="in-process stream bridge",
    )


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory="runstore.plugins.memory.runs:MemoryRunStore.open",
        capabilities=["bulk_import"],
        description="in-process run store (the SQL run store's rules on a private in-memory db)",
    )


@hookimpl
def runstore_register_history_caches(registry: HistoryCacheRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory="runstore.plugins.memory.cache:MemoryHistoryCache.open",
        description="in-process LRU cache of delta history",
    )
