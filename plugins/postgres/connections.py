"""The PostgreSQL saver's connections: leased from the engine it shares with the event store.

The saver takes raw asyncpg connections from the SQLAlchemy engine the PostgreSQL
event store uses for the same URL (one pool, one ``search_path``, one size limit)
and keeps a few of them leased between calls (`Leases`). `run_statement_batch` is the
saver's group-commit callback (`runstore.checkpoint.groupcommit`): a batch of write
statements in one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from runstore.checkpoint.groupcommit import Outcome
from runstore.errors import MissingDriverError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

R = TypeVar("R")

__all__ = ["Leases", "Statement", "import_asyncpg", "run_statement_batch"]

#: One write: SQL text and its arguments.
Statement = tuple[str, Sequence[Any]]


def import_asyncpg() -> Any:
    """The asyncpg module, or `MissingDriverError` naming the extra to install."""
    try:
        import asyncpg
    except ImportError:
        raise MissingDriverError("postgres", "asyncpg", "postgres") from None
    return asyncpg


class Leases:
    """Raw asyncpg connections borrowed from the shared SQLAlchemy engine.

    Up to ``max_idle`` stay checked out between calls: a checkout from the engine's
    pool runs its event hooks (and a ping after a second idle), which costs more
    than a small statement. A leased connection that turns out dead is discarded
    (invalidated in the engine's pool) and the call retried once on a fresh one.
    """

    def __init__(
        self, engine: AsyncEngine, max_idle: int, *, synchronous_commit: bool = True
    ) -> None:
        self._engine = engine
        self._max_idle = max_idle
        # Session settings live only while the connection is leased: the pool is shared
        # with the event store, so they are reset before a connection goes back.
        self._setup = None if synchronous_commit else "SET synchronous_commit = off"
        self._reset = None if synchronous_commit else "RESET synchronous_commit"
        self._server_error: type[BaseException] = import_asyncpg().PostgresError
        self._idle: list[tuple[AsyncConnection, Any]] = []
        self._closed = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def _fresh(self) -> tuple[AsyncConnection, Any]:
        sa_conn = await self._engine.connect()
        try:
            raw = await sa_conn.get_raw_connection()
            driver = raw.driver_connection
            if self._setup is not None:
                await driver.execute(self._setup)
        except BaseException:
            await sa_conn.close()
            raise
        return sa_conn, driver

    async def run(self, fn: Callable[[Any], Awaitable[R]]) -> R:
        """Run ``fn(connection)`` on a leased connection (retried once if the lease was dead)."""
        reused = bool(self._idle)
        lease = self._idle.pop() if reused else await self._fresh()
        try:
            result = await fn(lease[1])
        except BaseException as exc:
            broken = lease[1].is_closed()
            await self._after_error(lease, exc)
            if not (reused and broken):
                raise
            lease = await self._fresh()
            try:
                result = await fn(lease[1])
            except BaseException as exc2:
                await self._after_error(lease, exc2)
                raise
        self._give_back(lease)
        return result

    async def _after_error(self, lease: tuple[AsyncConnection, Any], exc: BaseException) -> None:
        raw = lease[1]
        # A statement the server rejected leaves the connection usable; anything else
        # (cancellation mid-query, a network error) may leave it mid-protocol, so it is
        # invalidated rather than handed to the next user of the pool.
        if (
            isinstance(exc, self._server_error)
            and not raw.is_closed()
            and not raw.is_in_transaction()
        ):
            self._give_back(lease)
        else:
            await self._discard(lease, invalidate=True)

    def _give_back(self, lease: tuple[AsyncConnection, Any]) -> None:
        if self._closed or len(self._idle) >= self._max_idle or lease[1].is_closed():
            task = asyncio.ensure_future(self._discard(lease, invalidate=lease[1].is_closed()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._idle.append(lease)

    async def _discard(self, lease: tuple[AsyncConnection, Any], *, invalidate: bool) -> None:
        sa_conn, raw = lease
        if not invalidate and self._reset is not None:
            try:
                await raw.execute(self._reset)
            except Exception:  # cannot restore the session: never pool it
                invalidate = True
        try:
            if invalidate:
                await sa_conn.invalidate()
            await sa_conn.close()
        except Exception:  # a dead connection may fail to close; drop it
            pass

    async def aclose(self) -> None:
        """Return every idle connection to the engine's pool."""
        self._closed = True
        idle, self._idle = self._idle, []
        for lease in idle:
            await self._discard(lease, invalidate=False)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def run_statement_batch(leases: Leases, batch: list[Statement]) -> list[Outcome]:
    """Run write statements as one transaction; one `Outcome` per statement.

    Statements are grouped by SQL text, in arrival order, and each group sent as one
    ``executemany`` (asyncpg pipelines its argument sets in one round trip); a batch of
    one statement kind needs no ``BEGIN``/``COMMIT`` (``executemany`` is atomic). Rows
    one caller touches twice keep their order; rows of different statements never
    overlap. If the batch fails, it is re-run one statement at a time (every write
    statement is idempotent), so only the bad one fails.
    """
    if len(batch) > 1:
        groups: dict[str, list[Sequence[Any]]] = {}
        for statement, args in batch:
            groups.setdefault(statement, []).append(args)

        async def together(conn: Any) -> None:
            if len(groups) == 1:
                [(statement, many)] = groups.items()
                await conn.executemany(statement, many)
                return
            async with conn.transaction():
                for statement, many in groups.items():
                    await conn.executemany(statement, many)

        try:
            await leases.run(together)
        except Exception:  # retried one by one below
            pass
        else:
            return [(True, None)] * len(batch)
    outcomes: list[Outcome] = []
    for statement, args in batch:
        try:
            await leases.run(lambda conn, s=statement, a=args: conn.execute(s, *a))
        except Exception as exc:
            outcomes.append((False, exc))
        else:
            outcomes.append((True, None))
    return outcomes
