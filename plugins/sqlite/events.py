"""The sqlite run event store: `runstore.sql.events.SqlEventStore` on aiosqlite.

The store writes through the file's group commit (`runstore.plugins.sqlite.commits`),
on the writer it shares with the sqlite saver and run store (`SqliteFile`): concurrent
appends of every thread, and the other stores' writes, commit in one transaction. It reads on that writer too while no
write is queued, else on a pooled connection it holds for its lifetime
(`FileCommits.read`). Each operation is one function call on a connection's worker
thread against the stdlib ``sqlite3`` connection. A cancelled write returns once it is
over (`FileCommits.submit`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, ClassVar

from runstore.errors import StaleFenceError
from runstore.events.protocol import HIDDEN_CALLER_PREFIX
from runstore.events.schema import AI_TYPES_SQL, INSERT_COLUMNS, TABLE, events_migrations
from runstore.events.sql import (
    EXISTING_SQL,
    FENCE_OF_SQL,
    FENCE_SQL,
    Params,
    Row,
    SqlEventDriver,
    SqlEventStore,
)
from runstore.options import BackendOptions
from runstore.sql.migrations import Migration
from runstore.urls import BackendURL

from .adapter import WorkerConnection
from .errors import translated_errors
from .file import SqliteFile, shared_file

#: The event store's migrations on sqlite (the backfill reads the JSON with json_extract).
SQLITE_MIGRATIONS = events_migrations(
    [
        f"UPDATE {TABLE} SET task_id = json_extract(metadata, '$.task_id') "
        "WHERE json_type(metadata, '$.task_id') = 'text'",
        f"UPDATE {TABLE} SET visible_ai = 1 WHERE category = 'message' "
        f"AND event_type IN ({AI_TYPES_SQL}) AND NOT coalesce("
        "json_type(metadata, '$.caller') = 'text' AND "
        f"substr(json_extract(metadata, '$.caller'), 1, {len(HIDDEN_CALLER_PREFIX)}) = "
        f"'{HIDDEN_CALLER_PREFIX}', 0)",
    ]
)

_INSERT = (
    f"INSERT INTO {TABLE} ({', '.join(INSERT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(INSERT_COLUMNS))})"
)
_MAX_SEQ = f"SELECT coalesce(max(seq), 0) FROM {TABLE} WHERE thread_id = ?"
BACKEND = "sqlite event store"
_CLOSED = "this event store is closed"


class SqliteEventDriver(SqlEventDriver):
    """Reads on the store's reader, writes through the file's group commit; one hop each."""

    def __init__(self, file: SqliteFile) -> None:
        self._engine = file.engine
        self._commits = file.commits
        self._reader: WorkerConnection | None = None
        self._writing = False

    async def start(self) -> None:
        self._reader = await WorkerConnection.checkout(self._engine)
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

    async def fetch(self, sql: str, params: Params) -> list[Row]:
        if self._reader is None:
            raise RuntimeError(_CLOSED)
        with translated_errors(BACKEND, "read"):
            return await self._commits.read(self._reader, _fetchall, sql, params)

    async def _write(self, operation: str, thread: str | None, fn: Any, *args: Any) -> Any:
        """Run ``fn`` in the file's next group commit; ``thread``: the one thread it writes,
        if one (a lone caller's op then runs in its own task, `runstore.plugins.sqlite.commits`)."""
        if not self._writing:
            raise RuntimeError(_CLOSED)
        with translated_errors(BACKEND, operation):
            return await self._commits.submit(fn, *args, key=thread)

    async def insert(self, rows: list[list[Any]], fence: int | None = None) -> list[int]:
        # Row index 0 is the thread id (`runstore.sql.events.insert_row`).
        thread = rows[0][0] if rows and all(row[0] == rows[0][0] for row in rows) else None
        seqs: list[int] = await self._write("put", thread, _insert, rows, fence)
        return seqs

    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any], fence: int | None = None
    ) -> tuple[Row | None, int]:
        found: tuple[Row | None, int] = await self._write(
            "put_if_absent", row[0], _insert_if_absent, key, row, fence
        )
        return found

    async def fence(self, thread_id: str, fence: int) -> None:
        await self._write("fence_thread", thread_id, _fence, {thread_id}, fence)

    async def import_rows(self, rows: list[list[Any]]) -> int:
        thread = rows[0][0] if rows and all(row[0] == rows[0][0] for row in rows) else None
        count: int = await self._write("import_events", thread, _import_rows, rows)
        return count

    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        count: int = await self._write(
            "delete", thread_id, _delete, f"DELETE FROM {TABLE} WHERE {where}", params
        )
        return count


def _fetchall(conn: sqlite3.Connection, sql: str, params: Params) -> list[Row]:
    return conn.execute(sql, params).fetchall()


def _fence(conn: sqlite3.Connection, thread_ids: set[str], fence: int | None) -> None:
    """The fence compare-and-set of each thread, in the caller's write transaction."""
    if fence is None:
        return
    for thread_id in sorted(thread_ids):
        if conn.execute(FENCE_SQL, (thread_id, fence)).fetchone() is None:
            (current,) = conn.execute(FENCE_OF_SQL, (thread_id,)).fetchone()
            raise StaleFenceError(thread_id, fence, int(current))


def _insert(conn: sqlite3.Connection, rows: list[list[Any]], fence: int | None = None) -> list[int]:
    _fence(conn, {r[0] for r in rows}, fence)
    last = {tid: conn.execute(_MAX_SEQ, (tid,)).fetchone()[0] for tid in {r[0] for r in rows}}
    seqs = []
    for row in rows:
        last[row[0]] += 1
        row[1] = last[row[0]]
        seqs.append(row[1])
    conn.executemany(_INSERT, rows)
    return seqs


def _insert_if_absent(
    conn: sqlite3.Connection, key: tuple[str, str, str], row: list[Any], fence: int | None = None
) -> tuple[Row | None, int]:
    _fence(conn, {row[0]}, fence)
    found = conn.execute(EXISTING_SQL, key).fetchone()
    if found is not None:
        return tuple(found), 0
    row[1] = conn.execute(_MAX_SEQ, (row[0],)).fetchone()[0] + 1
    conn.execute(_INSERT, row)
    return None, row[1]


_IMPORT = _INSERT.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1)


def _import_rows(conn: sqlite3.Connection, rows: list[list[Any]]) -> int:
    before = conn.total_changes
    conn.executemany(_IMPORT, rows)
    return conn.total_changes - before


def _delete(conn: sqlite3.Connection, sql: str, params: Params) -> int:
    return conn.execute(sql, params).rowcount


class SqliteEventStore(SqlEventStore):
    """Event store in a sqlite file, sharing the file (`SqliteFile`) with the other sqlite stores.

    Writers serialize on the file's write lock (``BEGIN IMMEDIATE``), so concurrent
    processes on one file stay consistent.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.sqlite.events import SqliteEventStore


    async def main() -> None:
        async with SqliteEventStore.from_conn_string("app.sqlite") as store:
            await store.setup()  # create the tables (runstore.open does this for you)
            # user_id=None: events without an owner (a web app wraps its calls in
            # runstore.owner_scope(user) instead)
            await store.put(thread_id="thread-1", run_id="run-1", event_type="human",
                            category="message", content="hello", user_id=None)
            page = await store.list_messages("thread-1", user_id=None)
            print([(event["seq"], event["content"]) for event in page])  # [(1, 'hello')]


    asyncio.run(main())
    ```
    """

    #: URL query options the store accepts (none).
    url_options: ClassVar[frozenset[str]] = frozenset()
    schema_migrations: ClassVar[Sequence[Migration]] = SQLITE_MIGRATIONS
    file_scheme: ClassVar[str | None] = "sqlite"

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqliteEventStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed."""
        file = await shared_file(url, options, cls.url_options)
        return await cls.start(file.engine, SqliteEventDriver(file), options, SQLITE_MIGRATIONS)
