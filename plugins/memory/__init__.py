"""Built-in plugin ``memory``: in-process saver, event store, stream bridge, run store, history
cache and long-term memory store.

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
        StoreRegistry,
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
        capabilities=["cache_max_entries"],
        description="in-process LRU cache of delta history",
    )


#: What the memory store promises (every store capability there is).
STORE_CAPABILITIES = (
    "sync_api",
    "store_clock",
    "store_ttl",
    "store_nested_filters",
    "store_numeric_filters",
    "store_vector_search",
    "store_ordered_batch",
    "store_namespace_cleanup",
    "checked_store_input",
    "bulk_import",
)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add(
        "memory",
        schemes=["memory"],
        factory="runstore.plugins.memory.store:MemoryStore.open",
        capabilities=STORE_CAPABILITIES,
        description="in-process long-term memory store (LangGraph BaseStore)",
    )
