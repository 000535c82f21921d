"""Built-in plugin ``sqlite``: checkpoint saver, event store, run store and long-term memory
store in one sqlite file.

``sqlite:///relative/app.db`` and ``sqlite:////absolute/app.db`` as in SQLAlchemy;
the stores opened on the same file share one engine.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstore.hookspecs import hookimpl
from runstore.urls import BackendURL

from .settings import SqliteSettings

if TYPE_CHECKING:
    from runstore.registry import (
        EventStoreRegistry,
        RunStoreRegistry,
        SaverRegistry,
        SettingsRegistry,
        StoreRegistry,
    )


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "sqlite",
        schemes=["sqlite"],
        factory="runstore.plugins.sqlite.saver:SqliteSaver.open",
        capabilities=[
            "durable",
            "cross_process",
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
            "bulk_import",
        ],
        description="aiosqlite checkpoint saver: sqlite:///path/app.db",
    )


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "sqlite",
        schemes=["sqlite"],
        factory="runstore.plugins.sqlite.events:SqliteEventStore.open",
        capabilities=["durable", "cross_process", "owner_filter", "fencing", "bulk_import"],
        description="SQLAlchemy/aiosqlite event store: sqlite:///path/app.db",
    )


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add(
        "sqlite",
        schemes=["sqlite"],
        factory="runstore.plugins.sqlite.runs:SqliteRunStore.open",
        capabilities=["durable", "cross_process", "bulk_import"],
        description="aiosqlite run store: sqlite:///path/app.db",
    )


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add(
        "sqlite",
        schemes=["sqlite"],
        factory="runstore.plugins.sqlite.store:SqliteStore.open",
        capabilities=STORE_CAPABILITIES,
        description="aiosqlite long-term memory store (LangGraph BaseStore): sqlite:///path/app.db",
    )


#: What the sqlite and PostgreSQL memory stores promise (docs/store.md).
STORE_CAPABILITIES = [
    "durable",
    "cross_process",
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
]


@hookimpl
def runstore_register_settings(registry: SettingsRegistry) -> None:
    registry.add("sqlite", SqliteSettings, description="durability and locking of sqlite files")


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme != "sqlite":
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        with tempfile.TemporaryDirectory(prefix="runstore-sqlite-") as tmp:
            scratch_url = BackendURL.for_file("sqlite", Path(tmp, "conformance.db"))
            yield scratch_url.with_query(**dict(url.query))

    return scratch()
