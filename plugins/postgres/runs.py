"""The PostgreSQL run store: `runstore.sql.runs.SqlRunStore` on asyncpg.

Each operation takes one asyncpg connection from the shared pool and runs its script
in one transaction, a statement per round trip; the scripts take the row locks
(``FOR UPDATE`` on the thread's row, ``FOR UPDATE SKIP LOCKED`` for claims) that make
their checks and writes one atomic step across processes and hosts. asyncpg is
imported only when a store is opened.

Connections are leased through `runstore.plugins.postgres.connections.PostgresCalls`, the
rules the event store and the saver follow (docs/reliability.md): a whole call is
bounded by ``operation_timeout`` (connect and statements by their own bounds, cut to
what is left of it; the reruns after a lost unique-key race included), a
connection lost before a write's ``COMMIT`` was sent (or during a read) is retried on
a fresh one until then, anything else is `BackendUnavailableError`; a call that fails
or times out mid-statement has its connection rolled back or closed, never reused
inside a transaction.

Cancellation: an operation runs in its own task; a caller cancelled meanwhile waits
for that task to commit or roll back and then gets its `asyncio.CancelledError`. So a
cancelled call has written all or nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.cancellation import settle
from runstore.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    RunError,
    RunstoreError,
    SchemaNotSetUpError,
)
from runstore.options import BackendOptions
from runstore.retry import Deadline, deadline_cause, retried
from runstore.runs.sql import COMPONENT, MIGRATIONS, RunDialect, RunDriver, Script, SqlRunStore
from runstore.sql.migrations import Migration, ensure_schema
from runstore.urls import BackendURL

from .connections import PostgresCalls
from .engine import POSTGRES, URL_OPTIONS, FromEngine, shared_database
from .settings import PostgresTimeouts

T = TypeVar("T")

BACKEND = "postgres run store"
#: Attempts of a write that lost a unique-key race with another thread's create (or,
#: which the lock order rules out, a deadlock): the rerun sees the winner's row. All of
#: them, and their connection retries, share the call's one ``operation_timeout``.
ATTEMPTS = 3


@functools.lru_cache(maxsize=256)
def _sql(text: str) -> str:
    return POSTGRES.placeholders(text)


async def _drive(raw: Any, script: Script[T]) -> T:
    """Run ``script`` on asyncpg connection ``raw``, one round trip per statement."""
    try:
        stmt = next(script)
        while True:
            rows = await raw.fetch(_sql(stmt.sql), *stmt.params)
            stmt = script.send([tuple(r) for r in rows])
    except StopIteration as done:
        return done.value


def _server_error(exc: BaseException) -> BaseException:
    """The server's own error under a `BackendRefusedError` (``exc`` itself otherwise)."""
    if isinstance(exc, BackendRefusedError) and isinstance(exc.__cause__, Exception):
        return exc.__cause__
    return exc


def _raced(exc: Exception) -> bool:
    """A unique or deadlock conflict with another writer: the rerun sees the winner's row."""
    import asyncpg

    return isinstance(_server_error(exc), asyncpg.UniqueViolationError | asyncpg.DeadlockDetectedError)


def _unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server could not be reached, went away or timed out."""
    import asyncpg
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
    return isinstance(
        exc,
        OSError
        | TimeoutError
        | asyncpg.PostgresConnectionError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.OperatorInterventionError
        | asyncpg.exceptions.QueryCanceledError
        | asyncpg.exceptions.TooManyConnectionsError
        | sa_exc.DisconnectionError
        | sa_exc.TimeoutError,
    )


class PostgresRunDialect(RunDialect):
    """Concurrent writers: the scripts lock the rows they decide on; lists are one array parameter."""

    row_locks: ClassVar[bool] = True

    def in_list(self, column: str, values: Sequence[Any], params: list[Any]) -> str:
        """One array parameter (`PostgresDialect.in_list`)."""
        return POSTGRES.in_list(column, values, params)


class PostgresRunDriver(RunDriver):
    """asyncpg connections leased from the shared pool, one per operation."""

    dialect: ClassVar[RunDialect] = PostgresRunDialect()

    #: None kept between calls: the event store and the saver keep theirs, and the run
    #: store must never wait for a pool they hold.
    MAX_IDLE_CONNECTIONS = 0

    def __init__(self, engine: AsyncEngine, timeouts: PostgresTimeouts | None = None) -> None:
        self._engine = engine
        self._leases = PostgresCalls(
            engine, self.MAX_IDLE_CONNECTIONS, backend=BACKEND, timeouts=timeouts or PostgresTimeouts()
        )

    async def close(self) -> None:
        await self._leases.aclose()

    async def write(self, script: Callable[[], Script[T]], operation: str) -> T:
        return await settle(self._run(script, operation, write=True))

    async def read(self, script: Callable[[], Script[T]], operation: str) -> T:
        return await settle(self._run(script, operation, write=False))

    async def _run(self, script: Callable[[], Script[T]], operation: str, *, write: bool) -> T:
        leases = self._leases
        # One deadline for the whole call: a rerun after a lost race gets what is left.
        deadline = Deadline.after(leases.timeouts.operation)

        async def attempt(deadline: Deadline) -> T:
            # A write's script runs inside BEGIN ... COMMIT (PostgresCalls commits it).
            return await leases.run(
                lambda raw: _drive(raw, script()), operation=operation, write=write,
                begin="BEGIN" if write else None, deadline=deadline,
            )

        def give_up(last: BaseException | None) -> BackendUnavailableError:
            cause = deadline_cause(None if last is None else _server_error(last), deadline)
            return BackendUnavailableError(BACKEND, operation, write_may_have_happened=False, cause=cause)

        try:
            return await retried(
                attempt, deadline, transient=_raced, give_up=give_up, backoff=(0.0,), attempts=ATTEMPTS
            )
        except SchemaNotSetUpError:
            raise  # says what to do (call setup()); a RunError would hide it
        except BackendRefusedError as refused:
            exc = _server_error(refused)
        except RunstoreError:
            raise
        except Exception as other:
            exc = other
        # Rolled back before it reached the caller: whatever failed wrote nothing.
        if _unavailable(exc):
            raise BackendUnavailableError(
                BACKEND, operation, write_may_have_happened=False, cause=exc
            ) from exc
        raise RunError(
            f"{BACKEND}: {operation} failed ({type(exc).__name__}: {exc}); nothing was written"
        ) from exc


class PostgresRunStore(SqlRunStore, FromEngine):
    """Run store in PostgreSQL; ``?schema=NAME`` keeps its tables in that schema.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.postgres.runs import PostgresRunStore


    async def main() -> None:
        async with PostgresRunStore.from_conn_string("postgresql://app@localhost:5432/app") as runs:
            await runs.setup()  # create the tables (runstore.open does this for you)
            created = await runs.create("thread-1")
            run = await runs.start(created.run["run_id"], owner="worker-1", ttl=30)
            renewed, cancel = await runs.renew_lease(run["run_id"], "worker-1", ttl=30)
            done = await runs.finalize(run["run_id"], "worker-1", "success")
            print(done["status"])  # success


    asyncio.run(main())
    ```

    `PostgresRunStore.from_engine(engine)` runs it on your SQLAlchemy engine (never disposed here).
    """

    #: URL query options the store accepts (`runstore.plugins.postgres.engine.URL_OPTIONS`).
    url_options: ClassVar[frozenset[str]] = URL_OPTIONS
    schema_component: ClassVar[str | None] = COMPONENT
    schema_migrations: ClassVar[Sequence[Migration]] = MIGRATIONS

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> PostgresRunStore:
        """Open ``postgresql://...``, creating the schema and tables or upgrading them as needed."""
        database = await shared_database(url, options)
        if options.migrate:
            await ensure_schema(database.engine, COMPONENT, MIGRATIONS)
        store = cls(PostgresRunDriver(database.engine, database.timeouts))
        store.engine = database.engine
        options.on_close(store.close)
        return store
