"""The sqlite run event store: `runstore.sql.events.SqlEventStore` on aiosqlite.

The store holds two pooled connections for its lifetime, a writer and a reader
(`runstore.plugins.sqlite.adapter.WorkerConnection`); each operation is one function
call on the connection's worker thread against the stdlib ``sqlite3`` connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.errors import InvalidURLError
from runstore.events import HIDDEN_CALLER_PREFIX
from runstore.options import BackendOptions
from runstore.sql.events import EXISTING_SQL, Params, Row, SqlEventDriver, SqlEventStore
from runstore.sql.schema import AI_TYPES_SQL, INSERT_COLUMNS, TABLE, events_migrations
from runstore.urls import BackendURL

from .adapter import WorkerConnection
from .engine import shared_engine, sqlite_write_lock

R = TypeVar("R")

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


class SqliteEventDriver(SqlEventDriver):
    """Two pooled aiosqlite connections held for the store's life: a writer and a reader.

    Writers open ``BEGIN IMMEDIATE`` (the file's write lock, waiting up to
    busy_timeout, serializing every writer of every process) after queueing on the
    engine's in-process write lock, shared with the sqlite saver. The reader never
    waits for a writer (WAL).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._lock = sqlite_write_lock(engine)
        self._writer: WorkerConnection | None = None
        self._reader: WorkerConnection | None = None

    async def start(self) -> None:
        self._writer = await WorkerConnection.checkout(self._engine)
        self._reader = await WorkerConnection.checkout(self._engine)

    async def close(self) -> None:
        held = [c for c in (self._writer, self._reader) if c is not None]
        self._writer = self._reader = None
        for conn in held:
            await conn.close()

    @staticmethod
    def _held(conn: WorkerConnection | None) -> WorkerConnection:
        if conn is None:
            raise RuntimeError("this event store is closed")
        return conn

    async def _write(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        writer = self._held(self._writer)
        if self._lock is None:
            return await writer.run(_transaction, fn)
        async with self._lock:
            return await writer.run(_transaction, fn)

    async def fetch(self, sql: str, params: Params) -> list[Row]:
        return await self._held(self._reader).run(_fetchall, sql, params)

    async def insert(self, rows: list[list[Any]]) -> list[int]:
        def work(conn: sqlite3.Connection) -> list[int]:
            last = {
                tid: conn.execute(_MAX_SEQ, (tid,)).fetchone()[0] for tid in {r[0] for r in rows}
            }
            seqs = []
            for row in rows:
                last[row[0]] += 1
                row[1] = last[row[0]]
                seqs.append(row[1])
            conn.executemany(_INSERT, rows)
            return seqs

        return await self._write(work)

    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any]
    ) -> tuple[Row | None, int]:
        def work(conn: sqlite3.Connection) -> tuple[Row | None, int]:
            found = conn.execute(EXISTING_SQL, key).fetchone()
            if found is not None:
                return tuple(found), 0
            row[1] = conn.execute(_MAX_SEQ, (row[0],)).fetchone()[0] + 1
            conn.execute(_INSERT, row)
            return None, row[1]

        return await self._write(work)

    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        sql = f"DELETE FROM {TABLE} WHERE {where}"

        def work(conn: sqlite3.Connection) -> int:
            return conn.execute(sql, params).rowcount

        return await self._write(work)


def _fetchall(conn: sqlite3.Connection, sql: str, params: Params) -> list[Row]:
    return conn.execute(sql, params).fetchall()


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], R]) -> R:
    """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction: committed if it returns, else rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


class SqliteEventStore(SqlEventStore):
    """Event store in a sqlite file, sharing the file's engine with the sqlite saver.

    Writers serialize on the file's write lock (``BEGIN IMMEDIATE``), so concurrent
    processes on one file stay consistent.
    """

    #: URL query options the store accepts (none).
    url_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqliteEventStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed."""
        url = BackendURL.parse(url)
        if url.scheme != "sqlite":
            raise InvalidURLError(f"{url} is not a sqlite:// URL")
        url.check_options(cls.url_options)
        engine = await shared_engine(url, options)
        return await cls.start(engine, SqliteEventDriver(engine), options, SQLITE_MIGRATIONS)
