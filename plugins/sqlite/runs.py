"""The sqlite run store: `runstore.sql.runs.SqlRunStore` on aiosqlite.

The store holds two pooled connections of the file's shared engine for its lifetime,
a writer and a reader (`runstore.plugins.sqlite.adapter.WorkerConnection`). A write
runs its whole script as one call on the writer's worker thread inside ``BEGIN
IMMEDIATE`` ... ``COMMIT`` (after queueing on the engine's in-process write lock, shared
with the saver and the event store), so every writer of every process is serialized
and each operation is all-or-nothing. A caller cancelled meanwhile does not stop the
call: it commits or rolls back as a whole on the worker thread, and the cancelled
caller returns (still holding the write lock) once it has (`runstore.cancellation.settle`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.cancellation import settle
from runstore.errors import BackendUnavailableError, InvalidURLError, RunError
from runstore.options import BackendOptions
from runstore.runs.sql import (
    COMPONENT,
    MIGRATIONS,
    RunDriver,
    Script,
    SqlRunStore,
    run_script,
)
from runstore.sql.migrations import Migration, ensure_schema
from runstore.urls import BackendURL

from .adapter import WriterAndReader
from .engine import shared_engine
from .errors import is_unavailable

T = TypeVar("T")

BACKEND = "sqlite run store"


class SqliteRunDriver(RunDriver):
    """A writer and a reader connection held for the store's life (`WriterAndReader`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._connections = WriterAndReader(engine, "this run store is closed")

    async def start(self) -> None:
        await self._connections.start()

    async def close(self) -> None:
        await self._connections.close()

    async def write(self, script: Callable[[], Script[T]], operation: str) -> T:
        try:
            return await settle(self._connections.write(run_script, script()))
        except sqlite3.Error as exc:
            raise _translate(exc, operation) from exc

    async def read(self, script: Callable[[], Script[T]], operation: str) -> T:
        try:
            return await self._connections.read(run_script, script())
        except sqlite3.Error as exc:
            raise _translate(exc, operation) from exc


def _translate(exc: sqlite3.Error, operation: str) -> Exception:
    """A runstore error for a driver error (the caller chains ``exc`` as ``__cause__``):
    `BackendUnavailableError` for `is_unavailable` ones (nothing was written), else `RunError`."""
    if is_unavailable(exc):
        return BackendUnavailableError(BACKEND, operation, write_may_have_happened=False, cause=exc)
    return RunError(f"{BACKEND}: {operation} failed ({type(exc).__name__}: {exc}); nothing was written")


class SqliteRunStore(SqlRunStore):
    """Run store in a sqlite file, sharing the file's engine with the saver and event store.

    Every write takes the file's write lock (``BEGIN IMMEDIATE``), so processes sharing
    the file stay consistent.
    """

    #: URL query options the store accepts (none).
    url_options: ClassVar[frozenset[str]] = frozenset()
    schema_component: ClassVar[str | None] = COMPONENT
    file_scheme: ClassVar[str | None] = "sqlite"
    schema_migrations: ClassVar[Sequence[Migration]] = MIGRATIONS

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqliteRunStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed."""
        url = BackendURL.parse(url)
        if url.scheme != "sqlite":
            raise InvalidURLError(f"{url} is not a sqlite:// URL")
        url.check_options(cls.url_options)
        engine = await shared_engine(url, options)
        if options.migrate:
            await ensure_schema(engine, COMPONENT, MIGRATIONS)
        driver = SqliteRunDriver(engine)
        await driver.start()
        store = cls(driver)
        store.engine = engine
        options.on_close(store.close)
        return store
