"""The sqlite run store: `runstore.sql.runs.SqlRunStore` on aiosqlite.

The store writes through the file's one writer and write queue (`SqliteFile.commits`,
`runstore.plugins.sqlite.commits`), which the saver and the event store on the file
share: a write runs its whole script as one op of the file's next ``BEGIN IMMEDIATE``
... ``COMMIT`` (in a savepoint of its own when other ops share the transaction), so
every writer of every process is serialized and each operation is all-or-nothing.
Reads run on the file's writer while no write is queued, else on a pooled connection
the store holds for its lifetime (`FileCommits.read`). A caller cancelled meanwhile
does not stop its write, even one still queued: the op runs and commits or rolls back
with its batch, and the cancelled caller returns once it has
(`runstore.cancellation.settle`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

from runstore.cancellation import settle
from runstore.errors import RunError
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

from .adapter import WorkerConnection
from .errors import translated_error
from .file import SqliteFile, shared_file

T = TypeVar("T")

BACKEND = "sqlite run store"
_CLOSED = "this run store is closed"


class SqliteRunDriver(RunDriver):
    """Writes through the file's write queue, reads on its idle writer or the store's reader."""

    def __init__(self, file: SqliteFile) -> None:
        self._file = file
        self._commits = file.commits
        self._reader: WorkerConnection | None = None
        self._writing = False

    async def start(self) -> None:
        self._reader = await WorkerConnection.checkout(self._file.engine)
        try:
            await self._commits.acquire()
        except BaseException:
            await self._reader.close()
            self._reader = None
            raise
        self._writing = True

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        writing, self._writing = self._writing, False
        if writing:
            await self._commits.release()
        if reader is not None:
            await reader.close()

    async def write(self, script: Callable[[], Script[T]], operation: str) -> T:
        if not self._writing:
            raise RuntimeError(_CLOSED)
        try:
            # Settled, not withdrawn: a cancelled caller's write still runs to its end.
            result: T = await settle(self._commits.submit(run_script, script()))
        except sqlite3.Error as exc:
            raise _translate(exc, operation) from exc
        return result

    async def read(self, script: Callable[[], Script[T]], operation: str) -> T:
        if self._reader is None:
            raise RuntimeError(_CLOSED)
        try:
            return await self._commits.read(self._reader, run_script, script())
        except sqlite3.Error as exc:
            raise _translate(exc, operation) from exc


def _translate(exc: sqlite3.Error, operation: str) -> Exception:
    """A runstore error for a driver error (the caller chains ``exc`` as ``__cause__``):
    `translated_error` where it has one (unavailable, tables not set up), else `RunError`."""
    translated = translated_error(exc, BACKEND, operation)
    if translated is not None:
        return translated
    return RunError(f"{BACKEND}: {operation} failed ({type(exc).__name__}: {exc}); nothing was written")


class SqliteRunStore(SqlRunStore):
    """Run store in a sqlite file, sharing the file (`SqliteFile`) with the saver and event store.

    Every write takes the file's write lock (``BEGIN IMMEDIATE``), so processes sharing
    the file stay consistent.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.sqlite.runs import SqliteRunStore


    async def main() -> None:
        async with SqliteRunStore.from_conn_string("app.sqlite") as runs:
            await runs.setup()  # create the tables (runstore.open does this for you)
            created = await runs.create("thread-1")
            run = await runs.start(created.run["run_id"], owner="worker-1", ttl=30)
            renewed, cancel = await runs.renew_lease(run["run_id"], "worker-1", ttl=30)
            done = await runs.finalize(run["run_id"], "worker-1", "success")
            print(done["status"])  # success


    asyncio.run(main())
    ```
    """

    #: URL query options the store accepts (none).
    url_options: ClassVar[frozenset[str]] = frozenset()
    schema_component: ClassVar[str | None] = COMPONENT
    file_scheme: ClassVar[str | None] = "sqlite"
    schema_migrations: ClassVar[Sequence[Migration]] = MIGRATIONS

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqliteRunStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed."""
        file = await shared_file(url, options, cls.url_options)
        if options.migrate:
            await ensure_schema(file.engine, COMPONENT, MIGRATIONS)
        driver = SqliteRunDriver(file)
        await driver.start()
        store = cls(driver)
        store.engine = file.engine
        options.on_close(store.close)
        return store
