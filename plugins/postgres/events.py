"""The PostgreSQL run event store: `runstore.sql.events.SqlEventStore` on asyncpg.

asyncpg is imported only when a store is opened (`runstore.plugins.postgres.engine`),
never at module import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.batching import BatchQueue, Outcome
from runstore.errors import BackendUnavailableError, StaleFenceError
from runstore.events.protocol import HIDDEN_CALLER_PREFIX
from runstore.events.schema import AI_TYPES_SQL, FENCES, INSERT_COLUMNS, TABLE, events_migrations
from runstore.events.sql import (
    EXISTING_SQL,
    FENCE_OF_SQL,
    Params,
    Row,
    SqlEventDriver,
    SqlEventStore,
)
from runstore.options import BackendOptions
from runstore.sql.migrations import Migration
from runstore.urls import BackendURL

from .connections import PostgresCalls, one_at_a_time
from .engine import POSTGRES, URL_OPTIONS, FromEngine, shared_database
from .settings import PostgresTimeouts

#: First key of the two-int advisory lock on a thread (the second is hashtext(thread_id)),
#: so our locks never collide with single-bigint advisory locks of other software.
PG_LOCK_NAMESPACE = 0x52534556  # "RSEV"

#: The event store's migrations on PostgreSQL (the backfill reads the JSON as jsonb).
POSTGRES_MIGRATIONS = events_migrations(
    [
        f"UPDATE {TABLE} SET task_id = metadata::jsonb ->> 'task_id' "
        "WHERE jsonb_typeof(metadata::jsonb -> 'task_id') = 'string'",
        f"UPDATE {TABLE} SET visible_ai = TRUE WHERE category = 'message' "
        f"AND event_type IN ({AI_TYPES_SQL}) AND NOT coalesce("
        "jsonb_typeof(metadata::jsonb -> 'caller') = 'string' AND "
        f"left(metadata::jsonb ->> 'caller', {len(HIDDEN_CALLER_PREFIX)}) = "
        f"'{HIDDEN_CALLER_PREFIX}', FALSE)",
    ]
)


def text_literal(value: str) -> str:
    """``value`` as a PostgreSQL escape string literal (``E'...'``), whatever the server's
    ``standard_conforming_strings``."""
    if "\x00" in value:
        raise ValueError("a PostgreSQL string cannot hold a NUL character")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


#: One call of the appends' group commit: its rows, its fencing token (``None``:
#: unfenced) and the threads it fences without rows (`PostgresEventDriver.fence`).
_Append = tuple[list[list[Any]], int | None, tuple[str, ...]]


class PostgresEventDriver(SqlEventDriver):
    """asyncpg connections leased from the shared pool (`PostgresCalls`), one per operation.

    Writes lock their threads with ``pg_advisory_xact_lock(namespace, hashtext(thread))``
    (released at commit) and insert a whole batch with one ``unnest`` statement that
    also allocates the seqs. The ``BEGIN`` and the lock go to the server as one
    message (`begin_locked`), so a write is three round trips: BEGIN and lock,
    insert, COMMIT. The insert must be a statement of its own: it reads the seqs
    other writers committed, which a statement sees only if it starts after the
    lock is granted. Writes are not idempotent (seqs, created flags, delete counts),
    so a lost connection is retried only if the ``COMMIT`` was never sent.

    Appends (``put``, ``put_batch``, fenced or not) of concurrent callers share those
    three round trips and one commit (`BatchQueue`): the appends that arrive while one
    transaction runs go out together in the next, each call's fence compare-and-set in
    arrival order before the one insert, each caller's rows still one contiguous block
    per thread and each call still whole or absent. If that transaction fails on a
    statement (a stale token included), its appends run again one call at a time, so
    only the bad call fails. A caller cancelled while its append is in flight
    returns once that transaction has ended (committed with it or rolled back).
    The price: appends of one process to different threads wait for each other's
    thread locks (a ``delete_by_thread`` of another process holding one delays the
    appends batched with it).
    """

    #: Leased connections kept between calls (each counts against the shared pool).
    MAX_IDLE_CONNECTIONS = 3

    # Locks are taken in key order, so two batches sharing threads (even threads whose
    # hashes collide) always lock in the same order and cannot deadlock.
    _LOCK = (
        f"SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, k) FROM "
        "(SELECT DISTINCT hashtext(t) AS k FROM unnest({threads}::text[]) AS t ORDER BY k) AS keys"
    )
    _INSERT = (
        f"INSERT INTO {TABLE} ({', '.join(INSERT_COLUMNS)}) "
        "SELECT u.thread_id, "
        f"coalesce((SELECT max(e.seq) FROM {TABLE} e WHERE e.thread_id = u.thread_id), 0) "
        "+ row_number() OVER (PARTITION BY u.thread_id ORDER BY u.ord), "
        "u.run_id, u.event_type, u.category, u.content, u.content_json, u.metadata, "
        "u.created_at, u.user_id, u.task_id, u.visible_ai "
        "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], "
        "$7::text[], $8::text[], $9::text[], $10::text[], $11::bool[]) WITH ORDINALITY "
        "AS u(thread_id, run_id, event_type, category, content, content_json, metadata, "
        "created_at, user_id, task_id, visible_ai, ord) "
        "RETURNING thread_id, seq"
    )
    _IMPORT = (
        f"INSERT INTO {TABLE} ({', '.join(INSERT_COLUMNS)}) "
        "SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], "
        "$6::text[], $7::bool[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bool[]) "
        "ON CONFLICT (thread_id, seq) DO NOTHING"
    )
    _EXISTING = POSTGRES.placeholders(EXISTING_SQL)
    # The fence checks of a transaction's calls in one statement, after their threads'
    # advisory locks (which every writer of the fence table holds, so it reads the fences
    # as they are): $1/$2 the (thread, token) of each fenced call's threads in arrival
    # order. A token is stale when older than its thread's fence or an earlier call's
    # token; the first stale one is returned (the transaction then rolls back). Else each
    # thread's fence rises to its newest token; one already there is not written, so the
    # appends of a lease after its grant write no fence row.
    _CHECK_FENCES = (
        "WITH c AS (SELECT * FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS c(thread_id, fence, ord)), "
        "cur AS (SELECT c.thread_id, c.fence, c.ord, coalesce(f.fence, 0) AS stored, "
        "greatest(coalesce(f.fence, 0), coalesce(max(c.fence) OVER (PARTITION BY c.thread_id ORDER BY c.ord "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS current "
        f"FROM c LEFT JOIN {FENCES} f ON f.thread_id = c.thread_id), "
        f"up AS (INSERT INTO {FENCES} AS f (thread_id, fence) "
        "SELECT thread_id, max(fence) FROM cur GROUP BY thread_id HAVING max(fence) > max(stored) "
        "ON CONFLICT (thread_id) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence < EXCLUDED.fence) "
        "SELECT thread_id, fence, current FROM cur WHERE fence < current ORDER BY ord LIMIT 1"
    )
    # A lone `fence` call: `FENCE_SQL` after the thread's advisory lock, in one autocommit
    # statement (the lock is the statement's source row, so it is held first and kept
    # to the commit: an append in flight commits before the fence rises, a later one
    # sees it). No row: the thread's fence is newer.
    _RAISE_FENCE = (
        f"WITH l AS (SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, hashtext($1))) "
        f"INSERT INTO {FENCES} AS f (thread_id, fence) SELECT $1, $2::bigint FROM l "
        "ON CONFLICT (thread_id) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence <= EXCLUDED.fence "
        "RETURNING fence"
    )
    _FENCE_OF = POSTGRES.placeholders(FENCE_OF_SQL)

    def __init__(self, engine: AsyncEngine, timeouts: PostgresTimeouts) -> None:
        self._leases = PostgresCalls(
            engine, self.MAX_IDLE_CONNECTIONS, backend="postgres event store", timeouts=timeouts
        )
        self._appends: BatchQueue[_Append] = BatchQueue(
            self._append_batch, settle_on_cancel=True
        )

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self._appends.wait_idle()
        await self._leases.aclose()

    def in_list(self, column: str, values: Sequence[str], params: list[Any]) -> str:
        """One array parameter (`PostgresDialect.in_list`)."""
        return POSTGRES.in_list(column, values, params)

    async def fetch(self, sql: str, params: Params) -> list[Row]:
        sql = POSTGRES.placeholders(sql)

        async def work(raw: Any) -> list[Row]:
            return [tuple(r) for r in await raw.fetch(sql, *params)]

        return await self._leases.run(work, operation="read")

    def begin_locked(self, threads: Sequence[str]) -> str:
        """``BEGIN`` and the advisory locks of ``threads`` as one message (one round trip).

        Statements sent together without parameters go over PostgreSQL's simple query
        protocol, so the thread ids are inlined as escaped string literals (and the
        server plans the lock statement each time, hence the short form for one thread).
        """
        if len(threads) == 1:  # the usual case: nothing to order, far less to plan
            return (
                f"BEGIN; SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, "
                f"hashtext({text_literal(threads[0])}))"
            )
        array = "ARRAY[" + ", ".join(text_literal(t) for t in threads) + "]"
        return "BEGIN; " + self._LOCK.replace("{threads}", array)

    async def _fenced(self, raw: Any, calls: Sequence[tuple[Sequence[str], int | None]]) -> None:
        """The fence checks of ``calls`` (their threads and tokens, in arrival order) in
        one statement (`_CHECK_FENCES`), after the threads' advisory locks."""
        pairs = [(t, fence) for threads, fence in calls if fence is not None for t in threads]
        if not pairs:
            return
        threads, fences = zip(*pairs, strict=True)
        stale = await raw.fetchrow(self._CHECK_FENCES, list(threads), list(fences))
        if stale is not None:
            raise StaleFenceError(stale[0], int(stale[1]), int(stale[2]))

    async def insert(self, rows: list[list[Any]], fence: int | None = None) -> list[int]:
        seqs: list[int] = await self._appends.submit((rows, fence, ()))
        return seqs

    async def _append_batch(self, batch: list[_Append]) -> list[Outcome]:
        """Insert the rows of several calls in one transaction; one outcome per call (the
        group-commit callback; module docstring of `runstore.batching`)."""
        if len(batch) == 1 and not batch[0][0]:
            _, fence, (thread_id,) = batch[0]
            assert fence is not None
            try:
                await self._raise_fence(thread_id, fence)
            except Exception as exc:
                return [(False, exc)]
            return [(True, [])]
        if len(batch) > 1:
            try:
                seqs = await self._insert(batch)
            except BackendUnavailableError as exc:
                return [(False, exc)] * len(batch)
            except Exception:  # a statement failed or a token was stale: each call on its own
                pass
            else:
                outcomes: list[Outcome] = []
                for rows, _, _ in batch:
                    outcomes.append((True, seqs[: len(rows)]))
                    seqs = seqs[len(rows) :]
                return outcomes
        return await one_at_a_time(batch, lambda call: self._insert([call]))

    async def _insert(self, calls: Sequence[_Append]) -> list[int]:
        """Insert the rows of ``calls`` in one transaction, after each call's fence check in
        order (`SqlEventDriver.insert`); the seqs in the calls' row order."""
        rows = [row for call_rows, _, _ in calls for row in call_rows]
        columns = list(zip(*rows, strict=True))
        fences = [(sorted({r[0] for r in call_rows} | set(only)), fence) for call_rows, fence, only in calls]
        threads = list({t for call_threads, _ in fences for t in call_threads})

        async def work(raw: Any) -> list[Any]:
            await self._fenced(raw, fences)
            if not rows:  # fence calls only
                return []
            return list(
                await raw.fetch(
                    self._INSERT,
                    columns[0],
                    columns[2],
                    columns[3],
                    columns[4],
                    columns[5],
                    columns[6],
                    columns[7],
                    columns[8],
                    columns[9],
                    columns[10],
                    columns[11],
                )
            )

        returned = await self._leases.run(
            work, operation="put", write=True, begin=self.begin_locked(threads)
        )
        # The statement numbers each thread's rows in input order; hand them back so.
        by_thread: dict[str, list[int]] = {}
        for thread_id, seq in returned:
            by_thread.setdefault(thread_id, []).append(int(seq))
        for seqs in by_thread.values():
            seqs.sort(reverse=True)
        out = []
        for row in rows:
            row[1] = by_thread[row[0]].pop()
            out.append(row[1])
        return out

    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any], fence: int | None = None
    ) -> tuple[Row | None, int]:
        async def work(raw: Any) -> tuple[Row | None, int]:
            await self._fenced(raw, [([row[0]], fence)])
            found = await raw.fetchrow(self._EXISTING, *key)
            if found is not None:
                return tuple(found), 0
            inserted = await raw.fetchrow(
                self._INSERT,
                [row[0]], [row[2]], [row[3]], [row[4]], [row[5]], [row[6]], [row[7]],
                [row[8]], [row[9]], [row[10]], [row[11]],
            )  # fmt: skip
            return None, int(inserted[1])

        return await self._leases.run(
            work, operation="put_if_absent", write=True, begin=self.begin_locked([row[0]])
        )

    async def fence(self, thread_id: str, fence: int) -> None:
        # A call of the appends' group commit without rows: concurrent grants (and
        # appends) share its transaction, each token checked in arrival order.
        await self._appends.submit(([], fence, (thread_id,)))

    async def _raise_fence(self, thread_id: str, fence: int) -> None:
        """`fence` when its transaction would hold it alone: one autocommit statement."""
        # Raising a fence twice to one token is the same as once: safe to resend.
        raised = await self._leases.query(
            "fetchval", (self._RAISE_FENCE, thread_id, fence), operation="fence_thread", write=True, idempotent=True
        )
        if raised is None:
            current = await self._leases.query("fetchval", (self._FENCE_OF, thread_id), operation="fence_thread")
            raise StaleFenceError(thread_id, fence, int(current))

    async def import_rows(self, rows: list[list[Any]]) -> int:
        columns = [list(column) for column in zip(*rows, strict=True)]
        threads = sorted({r[0] for r in rows})

        async def work(raw: Any) -> int:
            status = await raw.execute(self._IMPORT, *columns)
            return int(status.rsplit(" ", 1)[-1])

        # Insert-if-absent by (thread_id, seq): resending after a lost COMMIT inserts nothing twice.
        return await self._leases.run(
            work, operation="import_events", write=True, idempotent=True, begin=self.begin_locked(threads)
        )

    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        sql = POSTGRES.placeholders(f"DELETE FROM {TABLE} WHERE {where}")

        async def work(raw: Any) -> int:
            status = await raw.execute(sql, *params)
            return int(status.rsplit(" ", 1)[-1])

        return await self._leases.run(
            work, operation="delete", write=True, begin=self.begin_locked([thread_id])
        )


class PostgresEventStore(SqlEventStore, FromEngine):
    """Event store in PostgreSQL; ``?schema=NAME`` keeps its table in that schema.

    Writers of a thread serialize on a transaction advisory lock of the thread, so
    several processes (and hosts) can share the database.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.postgres.events import PostgresEventStore


    async def main() -> None:
        async with PostgresEventStore.from_conn_string("postgresql://app@localhost:5432/app") as store:
            await store.setup()  # create the tables (runstore.open does this for you)
            # user_id=None: events without an owner (a web app wraps its calls in
            # runstore.owner_scope(user) instead)
            await store.put(thread_id="thread-1", run_id="run-1", event_type="human",
                            category="message", content="hello", user_id=None)
            page = await store.list_messages("thread-1", user_id=None)
            print([(event["seq"], event["content"]) for event in page])  # [(1, 'hello')]


    asyncio.run(main())
    ```

    `PostgresEventStore.from_engine(engine)` runs it on your SQLAlchemy engine (never disposed here).
    """

    #: URL query options the store accepts (`runstore.plugins.postgres.engine.URL_OPTIONS`).
    url_options: ClassVar[frozenset[str]] = URL_OPTIONS
    schema_migrations: ClassVar[Sequence[Migration]] = POSTGRES_MIGRATIONS

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> PostgresEventStore:
        """Open ``postgresql://...``, creating the schema/table or upgrading them as needed."""
        database = await shared_database(url, options)
        driver = PostgresEventDriver(database.engine, database.timeouts)
        return await cls.start(database.engine, driver, options, POSTGRES_MIGRATIONS)
