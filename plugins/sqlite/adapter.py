"""The one module that touches aiosqlite's private API.

An aiosqlite ``Connection`` owns a worker thread and a stdlib ``sqlite3`` connection
used only from that thread. Its public API runs one statement per thread hop
(cursor, execute, fetch and close are a hop each); runstore's sqlite backends
instead run a whole logical operation (several statements, one transaction) as one
function in that thread. aiosqlite has no public call for that, so this module uses
the private ``Connection._execute(fn, *args)`` (queue a call on the worker thread)
and ``Connection._conn`` (the thread's ``sqlite3.Connection``), checks that both are
still there before first use, and is the only place to change when aiosqlite does.

`SUPPORTED_AIOSQLITE` is the version range pinned in pyproject.toml; CI installs
the newest release inside it and ``tests/sql/test_sqlite_adapter.py`` fails with
`UnsupportedDriverError`'s message when the private surface moves.
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from runstore.cancellation import wait_until_done
from runstore.errors import UnsupportedDriverError
from runstore.sql.dialect import dialect_of, driver_connection

#: The aiosqlite releases whose private surface this module is written against
#: (keep in step with the pin in pyproject.toml).
SUPPORTED_AIOSQLITE = ">=0.20,<0.23"

P = ParamSpec("P")
R = TypeVar("R")




def _installed() -> str:
    try:
        return version("aiosqlite")
    except PackageNotFoundError:  # pragma: no cover - aiosqlite is a dependency
        return "unknown"


def check_surface(aconn: Any) -> sqlite3.Connection:
    """Return the ``sqlite3.Connection`` behind aiosqlite connection ``aconn``.

    Raises `UnsupportedDriverError` naming the installed and supported versions when
    ``Connection._execute`` or ``Connection._conn`` is missing or changed shape.
    """
    problem = None
    execute = getattr(aconn, "_execute", None)
    if not inspect.iscoroutinefunction(execute):
        problem = "Connection._execute is missing or no longer a coroutine function"
    else:
        kinds = [p.kind for p in inspect.signature(execute).parameters.values()]
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if (
            not kinds
            or kinds[0] not in positional
            or inspect.Parameter.VAR_POSITIONAL not in kinds
            or inspect.Parameter.VAR_KEYWORD not in kinds
        ):
            problem = (
                f"Connection._execute changed its signature to {inspect.signature(execute)} "
                "(runstore calls it as _execute(fn, *args, **kwargs))"
            )
    raw = None
    if problem is None:
        try:
            raw = aconn._conn
        except AttributeError:
            problem = "Connection._conn is missing"
        except ValueError:
            problem = "Connection._conn is not connected"
        else:
            if not isinstance(raw, sqlite3.Connection):
                problem = f"Connection._conn is a {type(raw).__name__}, not a sqlite3.Connection"
    if problem is not None or raw is None:
        raise UnsupportedDriverError(
            f"aiosqlite {_installed()} is not supported by runstore's sqlite backends: "
            f"{problem}. runstore runs whole operations on aiosqlite's worker thread through "
            f"this private API; install aiosqlite{SUPPORTED_AIOSQLITE} "
            "(pip install 'aiosqlite" + SUPPORTED_AIOSQLITE + "')"
        )
    return raw


def worker_thread(dbapi_connection: Any) -> threading.Thread | None:
    """The thread of the aiosqlite connection behind SQLAlchemy's ``dbapi_connection``.

    ``None`` when the private attributes are not there: joining it is a courtesy at
    close, so an aiosqlite without them still works.
    """
    thread = getattr(getattr(dbapi_connection, "_connection", None), "_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def join_worker_threads(threads: list[threading.Thread], timeout: float) -> None:
    """Wait up to ``timeout`` seconds in all for closed connections' threads to end."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _nothing() -> None:
    return None


class WorkerConnection:
    """A pooled aiosqlite connection held out of the pool, running functions on its thread.

    Checked out of a SQLAlchemy engine with `checkout` and kept until `close`, which
    returns it to the pool. Calls queue on the thread in order, so one connection
    runs one function at a time.
    """

    def __init__(self, sa_conn: AsyncConnection, aconn: Any, raw: sqlite3.Connection) -> None:
        self._sa_conn: AsyncConnection | None = sa_conn
        self._aconn = aconn
        self._raw = raw

    @classmethod
    async def checkout(cls, engine: AsyncEngine) -> WorkerConnection:
        """Take one connection out of ``engine``'s pool (a sqlite+aiosqlite engine)."""
        sa_conn = await engine.connect()
        try:
            aconn = await driver_connection(sa_conn)
            raw = check_surface(aconn)
        except BaseException:
            await sa_conn.close()
            raise
        return cls(sa_conn, aconn, raw)

    @property
    def closed(self) -> bool:
        """Whether `close` has run."""
        return self._sa_conn is None

    async def run(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """Run ``fn(sqlite3_connection, *args, **kwargs)`` on the worker thread; return its result.

        One thread hop whatever ``fn`` does. A call after `close` raises `RuntimeError`.
        A cancelled call returns once ``fn`` has ended: a thread cannot be interrupted,
        so ``fn`` runs to its end (its transaction commits or rolls back whole), and
        the caller's cancellation waits for that, never leaving a write lock held or
        a write landing after the cancelled call returned.
        """
        if self._sa_conn is None:
            raise RuntimeError("this sqlite connection is closed")
        try:
            result: R = await self._aconn._execute(fn, self._raw, *args, **kwargs)
        except asyncio.CancelledError:
            # The worker runs its queue in order: a no-op queued now ends after ``fn``
            # (a closed connection's refusal of it ends the wait too). Nothing on the
            # normal path; the cancellation rule is `runstore.cancellation`'s.
            await wait_until_done(self._aconn._execute(_nothing))
            raise
        return result

    async def close(self) -> None:
        """Return the connection to the engine's pool (idempotent)."""
        sa_conn, self._sa_conn = self._sa_conn, None
        if sa_conn is not None:
            await sa_conn.close()


class WriterAndReader:
    """A store's two worker connections, held from `start` to `close`: a writer and a reader.

    `write` runs a function in a ``BEGIN IMMEDIATE`` transaction (the file's write lock,
    waiting up to busy_timeout, serializing every writer of every process) after
    queueing on the engine's in-process write lock, which the other sqlite backends on
    the file share. `read` runs on the reader, which never waits for a writer (WAL).
    """

    def __init__(self, engine: AsyncEngine, closed_message: str) -> None:
        self._engine = engine
        self._lock = dialect_of(engine).write_lock
        self._closed_message = closed_message
        self._writer: WorkerConnection | None = None
        self._reader: WorkerConnection | None = None

    async def start(self) -> None:
        """Check both connections out of the engine's pool."""
        self._writer = await WorkerConnection.checkout(self._engine)
        self._reader = await WorkerConnection.checkout(self._engine)

    async def close(self) -> None:
        """Return both connections to the pool (idempotent)."""
        held = [c for c in (self._writer, self._reader) if c is not None]
        self._writer = self._reader = None
        for conn in held:
            await conn.close()

    def _held(self, conn: WorkerConnection | None) -> WorkerConnection:
        if conn is None:
            raise RuntimeError(self._closed_message)
        return conn

    async def write(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``fn(conn, *args, **kwargs)`` in one write transaction: committed if it returns."""
        writer = self._held(self._writer)

        def work(conn: sqlite3.Connection) -> R:
            return fn(conn, *args, **kwargs)

        if self._lock is None:
            return await writer.run(immediate_transaction, work)
        async with self._lock:
            return await writer.run(immediate_transaction, work)

    async def read(
        self,
        fn: Callable[Concatenate[sqlite3.Connection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``fn(conn, *args, **kwargs)`` on the reader (each statement its own snapshot)."""
        return await self._held(self._reader).run(fn, *args, **kwargs)


def immediate_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], R]) -> R:
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
