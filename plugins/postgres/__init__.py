"""Built-in plugin ``postgres``: checkpoint saver, event store, run store and long-term memory
store on PostgreSQL via asyncpg.

``postgresql://user:password@host:5432/db?schema=app``; the optional ``schema``
option keeps runstore's tables in their own schema. A Unix socket or several servers are
named as libpq names them (`runstore.plugins.postgres.connect_options`). Needs
``runstore[postgres]``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runstore.hookspecs import hookimpl
from runstore.urls import BackendURL

from .settings import PostgresSettings

if TYPE_CHECKING:
    from runstore.registry import (
        EventStoreRegistry,
        RunStoreRegistry,
        SaverRegistry,
        SettingsRegistry,
        StoreRegistry,
    )

SCHEMES = ["postgresql", "postgres"]
DRIVERS = ["asyncpg"]


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "postgres",
        schemes=SCHEMES,
        factory="runstore.plugins.postgres.saver:PostgresSaver.open",
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
        drivers=DRIVERS,
        extra="postgres",
        description="asyncpg checkpoint saver: postgresql://user@host/db",
    )


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "postgres",
        schemes=SCHEMES,
        factory="runstore.plugins.postgres.events:PostgresEventStore.open",
        capabilities=["durable", "cross_process", "owner_filter", "fencing", "bulk_import"],
        drivers=DRIVERS,
        extra="postgres",
        description="SQLAlchemy/asyncpg event store: postgresql://user@host/db",
    )


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add(
        "postgres",
        schemes=SCHEMES,
        factory="runstore.plugins.postgres.runs:PostgresRunStore.open",
        capabilities=["durable", "cross_process", "bulk_import"],
        drivers=DRIVERS,
        extra="postgres",
        description="asyncpg run store: postgresql://user@host/db",
    )


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add(
        "postgres",
        schemes=SCHEMES,
        factory="runstore.plugins.postgres.store:PostgresStore.open",
        capabilities=[
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
        ],
        drivers=DRIVERS,
        extra="postgres",
        description="asyncpg long-term memory store (LangGraph BaseStore): postgresql://user@host/db",
    )


@hookimpl
def runstore_register_settings(registry: SettingsRegistry) -> None:
    registry.add("postgres", PostgresSettings, description="connection pool of the asyncpg backends")


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme not in SCHEMES:
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        import asyncpg

        from .connect_options import PostgresConnectOptions
        from .engine import URL_OPTIONS
        from .settings import PostgresSettings

        # Before connecting: a misspelled option would reach asyncpg as a server setting.
        url.check_options(URL_OPTIONS)
        schema = f"runstore_conf_{uuid.uuid4().hex[:12]}"
        # The URL's servers, TLS and session options as the backends read them (runstore's
        # own options, such as `pooler`, are no DSN options asyncpg knows).
        connect = {
            "user": url.username,
            "password": url.password,
            "database": url.path.lstrip("/") or None,
            **PostgresConnectOptions.resolve(url, PostgresSettings()).driver_args(),
        }
        conn = await asyncpg.connect(**connect)
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            await conn.close()
        try:
            yield url.with_query(schema=schema)
        finally:
            conn = await asyncpg.connect(**connect)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

    return scratch()
