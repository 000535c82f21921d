"""The shared SQLAlchemy engine of a sqlite file, configured for runstore's backends.

Every sqlite backend opened on one `BackendOptions` for the same file (the saver and
the event store, say) gets the same engine and pool from `shared_engine`.
Connection-level configuration happens in a pool ``connect`` hook, so raw driver
connections taken from the pool (`runstore.plugins.sqlite.adapter`) carry it too:
``journal_mode=WAL``, ``busy_timeout`` = ``sqlite.busy_timeout_ms``, ``synchronous``
= ``sqlite.synchronous``. The driver connection runs in autocommit mode
(``isolation_level=None``): SQLAlchemy transactions issue their own ``BEGIN``
(``BEGIN IMMEDIATE`` on a connection carrying the execution option
``runstore_write=True``), and raw users issue ``BEGIN IMMEDIATE`` ... ``COMMIT``
themselves. Read-only SQLAlchemy connections issue no ``BEGIN`` at all: each
statement is its own snapshot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from runstore.errors import InvalidURLError
from runstore.options import BackendOptions
from runstore.sql.dialect import SqlDialect, bind_dialect, dialect_of
from runstore.urls import BackendURL

from . import vectors
from .adapter import join_worker_threads, worker_thread
from .settings import SqliteSettings

#: Execution option asking a connection to start its transaction with BEGIN IMMEDIATE.
WRITE_OPTION = "runstore_write"

#: How long closing an engine waits for its connections' threads to end.
CLOSE_JOIN_SECONDS = 5.0


class SqliteDialect(SqlDialect):
    """sqlite: one writer at a time; this process's writers queue on `write_lock`.

    Queueing in-process writers on a lock instead of on ``busy_timeout`` polling keeps
    contention cheap and fair; ``BEGIN IMMEDIATE`` then serializes them with writers
    of other processes.
    """

    name: ClassVar[str] = "sqlite"

    def __init__(self) -> None:
        self.write_lock = asyncio.Lock()
        # Each pooled connection's aiosqlite thread, joined when the engine closes.
        self.worker_threads: list[threading.Thread] = []

    @asynccontextmanager
    async def schema_transaction(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``: the file's write lock serializes every process."""
        await conn.execution_options(**{WRITE_OPTION: True})
        try:
            async with conn.begin():
                yield
        finally:
            await conn.execution_options(**{WRITE_OPTION: False})


def database_path(url: BackendURL) -> Path:
    """The absolute path of the sqlite file ``url`` names; `InvalidURLError` if it names none.

    ``sqlite:///:memory:`` is refused rather than read as a file named ``:memory:``: the
    stores on one file share it through several connections, and SQLite gives each
    connection its own private in-memory database. ``memory://`` is the in-process backend.
    """
    path = url.file_path()
    if path is None or path.name == ":memory:":
        raise InvalidURLError(
            f"{url} names no file; use sqlite:///relative/path.db or sqlite:////absolute/path.db "
            "(sqlite's :memory: database is not supported: use memory:// for in-process stores)"
        )
    return path.expanduser().resolve()


def engine_key(url: BackendURL) -> tuple[str, str]:
    """The `BackendOptions.shared` key of the engine for ``url``: the absolute file path.

    Two spellings of one file (relative, absolute) share one engine and pool.
    """
    return ("sqlalchemy-engine", "sqlite:///" + str(database_path(url)))


async def shared_engine(url: BackendURL, options: BackendOptions) -> AsyncEngine:
    """Return the engine of the sqlite file ``url`` names, shared through ``options``.

    Created once per file (parent directories are created) and disposed when
    ``options`` close. See the module docstring for the configuration raw users inherit.
    """
    if url.scheme != "sqlite":
        raise InvalidURLError(f"{url} is not a sqlite:// URL")
    key = engine_key(url)

    async def opener() -> AsyncEngine:
        return await _open(Path(key[1][len("sqlite:///") :]), options)

    async def closer(engine: AsyncEngine) -> None:
        await engine.dispose()
        # aiosqlite's close stops a connection's thread without waiting for it to end;
        # joining here makes closing the stores mean no runstore thread is left running.
        dialect = dialect_of(engine)
        if isinstance(dialect, SqliteDialect):
            await asyncio.to_thread(join_worker_threads, dialect.worker_threads, CLOSE_JOIN_SECONDS)

    return await options.shared(key, opener, closer)


def sqlite_write_lock(engine: AsyncEngine) -> asyncio.Lock | None:
    """The in-process writer lock of a sqlite engine opened by `shared_engine`."""
    return dialect_of(engine).write_lock


async def _open(path: Path, options: BackendOptions) -> AsyncEngine:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    # Before the first connection: every connection then has sqlite-vec's functions.
    vectors.register()
    cfg = options.settings.section(SqliteSettings)
    engine = create_async_engine(
        URL.create("sqlite+aiosqlite", database=str(path)),
        # A writer holds its pooled connection for the whole transaction; readers in WAL
        # never block it, so a small pool serves many coroutines.
        pool_size=5,
        max_overflow=10,
        connect_args={"timeout": max(cfg.busy_timeout_ms, 0) / 1000.0},
    )
    busy_timeout_ms = int(cfg.busy_timeout_ms)
    dialect = SqliteDialect()

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        thread = worker_thread(dbapi_connection)
        if thread is not None:
            dialect.worker_threads[:] = [t for t in dialect.worker_threads if t.is_alive()]
            dialect.worker_threads.append(thread)
        # Autocommit at the driver level: we issue BEGIN ourselves so a writer can ask
        # for BEGIN IMMEDIATE (a deferred BEGIN that later upgrades to a write lock
        # fails with SQLITE_BUSY instead of waiting on busy_timeout).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            _ensure_wal(cursor, busy_timeout_ms)
            cursor.execute(f"PRAGMA synchronous = {cfg.synchronous.upper()}")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        # Readers issue no BEGIN: single statements are consistent on their own and
        # skipping it saves a hop to the aiosqlite thread.

    bind_dialect(engine, dialect)
    return engine


def _ensure_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Put the file in WAL mode, tolerating other processes opening it at the same time.

    Switching to WAL takes an exclusive lock and SQLite answers "database is locked"
    at once instead of waiting on busy_timeout. The mode is stored in the file, so only
    the first opener switches; later ones just read it, and a contended switch is retried
    until busy_timeout has passed.
    """
    deadline = time.monotonic() + max(busy_timeout_ms, 1000) / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":
                # The first opener of a new file: before any table exists, this makes
                # deleted pages reclaimable without rewriting the file (docs/threads.md).
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except Exception as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
