"""Test-only runstore plugin: LangGraph's stock SQL savers as third-party backends.

``langgraph-sqlite:///path.db`` is ``AsyncSqliteSaver`` on an aiosqlite connection;
``langgraph-postgresql://user@host/db?schema=s`` is ``AsyncPostgresSaver`` on a psycopg
connection whose ``search_path`` is that schema. Our run of the saver suite checks
both with the capabilities they honestly have: a native delta-history walk and sync
twins (called from other threads; on the loop thread they raise). Neither declares
``copy_thread``, ``prune`` (the PostgreSQL saver refuses ``keep_latest`` on threads
using a DeltaChannel) or ``delete_for_runs``.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

CAPABILITIES = ["delta_history", "sync_api", "durable", "cross_process"]


async def _open_sqlite(url: BackendURL, options: BackendOptions) -> Any:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    url.check_options(set())
    path = url.file_path()
    # An async context manager: runstore enters it and exits it when it closes the saver.
    return AsyncSqliteSaver.from_conn_string(str(path) if path else ":memory:")


def _libpq(url: BackendURL) -> tuple[str, str | None]:
    """The libpq URL (no runstore options) and the schema of a ``langgraph-postgresql`` URL."""
    postgres = replace(url, scheme="postgresql").without_query("schema")
    return postgres.render(hide_password=False), url.option("schema")


@asynccontextmanager
async def _postgres_saver(url: BackendURL) -> AsyncIterator[Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.conninfo import make_conninfo

    conninfo, schema = _libpq(url)
    if schema:
        conninfo = make_conninfo(conninfo, options=f"-c search_path={schema}")
    async with AsyncPostgresSaver.from_conn_string(conninfo) as saver:
        await saver.setup()
        yield saver


async def _open_postgres(url: BackendURL, options: BackendOptions) -> Any:
    url.check_options({"schema"})
    return _postgres_saver(url)


@asynccontextmanager
async def _scratch_sqlite(url: BackendURL) -> AsyncIterator[BackendURL]:
    with tempfile.TemporaryDirectory(prefix="langgraph-sqlite-") as tmp:
        yield BackendURL.for_file("langgraph-sqlite", Path(tmp) / "stock.db")


@asynccontextmanager
async def _scratch_postgres(url: BackendURL) -> AsyncIterator[BackendURL]:
    from psycopg import AsyncConnection

    conninfo, _ = _libpq(url)
    schema = f"lgstock_{uuid.uuid4().hex[:12]}"
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield url.with_query(schema=schema)
        finally:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme == "langgraph-sqlite":
        return _scratch_sqlite(url)
    if url.scheme == "langgraph-postgresql":
        return _scratch_postgres(url)
    return None


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "langgraph-sqlite",
        schemes=["langgraph-sqlite"],
        factory=_open_sqlite,
        capabilities=CAPABILITIES,
        description="LangGraph's stock AsyncSqliteSaver (test reference)",
    )
    registry.add(
        "langgraph-postgresql",
        schemes=["langgraph-postgresql"],
        factory=_open_postgres,
        capabilities=CAPABILITIES,
        description="LangGraph's stock AsyncPostgresSaver (test reference)",
    )
