"""Test-only runstore plugin: LangGraph's stock long-term memory stores as store backends.

``langgraph-store-memory://`` is ``InMemoryStore``; ``langgraph-store-sqlite:///path.db``
is ``AsyncSqliteStore``; ``langgraph-store-postgresql://user@host/db?schema=s`` is
``AsyncPostgresStore`` on a psycopg connection whose ``search_path`` is that schema. Each
declares what it honestly implements (docs/store.md lists the rules they do not keep).
A store opened with an index config (the suite's semantic-search tests) gets it, except
PostgreSQL, whose stock store needs the pgvector extension for it.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL

#: Whether this Python's sqlite3 can load extensions (sqlite-vec); a build without it
#: (some pyenv builds) cannot run the stock sqlite store's semantic search.
LOADABLE = hasattr(sqlite3.Connection, "enable_load_extension")
#: What each stock store declares.
MEMORY = ["sync_api", "store_vector_search"]
SQLITE = ["sync_api", "durable", "cross_process", "store_namespace_cleanup", *(["store_vector_search"] if LOADABLE else [])]
POSTGRES = ["sync_api", "durable", "cross_process", "store_namespace_cleanup"]


async def _open_memory(url: BackendURL, options: BackendOptions) -> Any:
    from langgraph.store.memory import InMemoryStore

    url.check_options(set())
    index, _ = store_config(options)
    return InMemoryStore(index=index)  # type: ignore[arg-type]


@asynccontextmanager
async def _sqlite_store(path: str, index: Any) -> AsyncIterator[Any]:
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    async with AsyncSqliteStore.from_conn_string(path, index=index) as store:
        await store.setup()
        yield store


async def _open_sqlite(url: BackendURL, options: BackendOptions) -> Any:
    url.check_options(set())
    path = url.file_path()
    index, _ = store_config(options)
    return _sqlite_store(str(path) if path else ":memory:", index)


def _libpq(url: BackendURL) -> tuple[str, str | None]:
    postgres = replace(url, scheme="postgresql").without_query("schema")
    return postgres.render(hide_password=False), url.option("schema")


@asynccontextmanager
async def _postgres_store(url: BackendURL) -> AsyncIterator[Any]:
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from psycopg.conninfo import make_conninfo

    conninfo, schema = _libpq(url)
    if schema:
        conninfo = make_conninfo(conninfo, options=f"-c search_path={schema}")
    async with AsyncPostgresStore.from_conn_string(conninfo) as store:
        await store.setup()
        yield store


async def _open_postgres(url: BackendURL, options: BackendOptions) -> Any:
    url.check_options({"schema"})
    return _postgres_store(url)


@asynccontextmanager
async def _scratch_sqlite(url: BackendURL) -> AsyncIterator[BackendURL]:
    with tempfile.TemporaryDirectory(prefix="langgraph-store-") as tmp:
        yield BackendURL.for_file("langgraph-store-sqlite", Path(tmp) / "stock.db")


@asynccontextmanager
async def _scratch_postgres(url: BackendURL) -> AsyncIterator[BackendURL]:
    from psycopg import AsyncConnection

    conninfo, _ = _libpq(url)
    schema = f"lgstore_{uuid.uuid4().hex[:12]}"
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield url.with_query(schema=schema)
        finally:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme == "langgraph-store-sqlite":
        return _scratch_sqlite(url)
    if url.scheme == "langgraph-store-postgresql":
        return _scratch_postgres(url)
    return None


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add("langgraph-store-memory", schemes=["langgraph-store-memory"], factory=_open_memory,
                 capabilities=MEMORY, description="LangGraph's stock InMemoryStore (test reference)")
    registry.add("langgraph-store-sqlite", schemes=["langgraph-store-sqlite"], factory=_open_sqlite,
                 capabilities=SQLITE, description="LangGraph's stock AsyncSqliteStore (test reference)")
    registry.add("langgraph-store-postgresql", schemes=["langgraph-store-postgresql"],
                 factory=_open_postgres, capabilities=POSTGRES,
                 description="LangGraph's stock AsyncPostgresStore (test reference)")
