"""`PostgresStore`: LangGraph's long-term memory store (`BaseStore`) in PostgreSQL via asyncpg.

The store shares the database (`PostgresDatabase`: one engine and pool, one
``search_path``) with the saver, the event store and the run store opened on the same
URL, and leases its connections through `runstore.plugins.postgres.connections.PostgresCalls`
like them: every call bounded by ``operation_timeout``, a lost connection retried only
while nothing can have been written twice, driver errors as `BackendUnavailableError`
or `BackendRefusedError` with the driver's error as ``__cause__``.

Each `abatch` is prepared first (validated and embedded, `runstore.store.sqlbatch`),
then its steps run in order on one connection (`runstore.plugins.postgres.store_sql`):
a batch of one op is one statement and one round trip (a read that refreshes
expiries writes them in the same statement); a batch of several runs inside one
``BEGIN`` ... ``COMMIT``, so it lands whole or not at all. A caller cancelled meanwhile
waits for its call to commit or roll back (`runstore.cancellation.settle`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from langgraph.store.base import IndexConfig, Op, Result, TTLConfig
from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.cancellation import settle
from runstore.clock import to_micros
from runstore.options import BackendOptions
from runstore.sql.migrations import Migration, ensure_schema
from runstore.store.base import StoreBase, store_config
from runstore.store.sqlbatch import PutStep, prepare
from runstore.store.vectorcache import VectorCache
from runstore.urls import BackendURL

from . import store_sql
from .connections import PostgresCalls
from .engine import URL_OPTIONS, FromEngine, shared_database
from .settings import PostgresTimeouts
from .store_bulk import PostgresStoreBulk

log = logging.getLogger(__name__)

BACKEND = "postgres memory store"
_CLOSED = "this postgres memory store is closed"


class PostgresStore(PostgresStoreBulk, StoreBase, FromEngine):
    """LangGraph `BaseStore` in PostgreSQL: filters in SQL over jsonb, TTL, semantic search
    over stored float32 vectors (no server extension); ``?schema=NAME`` keeps its tables
    in that schema."""

    closed_message = _CLOSED

    #: URL query options the store accepts (`runstore.plugins.postgres.engine.URL_OPTIONS`).
    url_options: ClassVar[frozenset[str]] = URL_OPTIONS
    schema_component: ClassVar[str | None] = store_sql.COMPONENT
    schema_migrations: ClassVar[Sequence[Migration]] = store_sql.MIGRATIONS

    #: Connections kept leased between calls (the saver and event store keep theirs).
    MAX_IDLE_CONNECTIONS = 2

    def __init__(
        self,
        engine: AsyncEngine,
        timeouts: PostgresTimeouts | None = None,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        self.engine = engine
        self._leases = PostgresCalls(
            engine, self.MAX_IDLE_CONNECTIONS, backend=BACKEND, timeouts=timeouts or PostgresTimeouts()
        )
        # The checked index and TTL rules, the clock (tests swap in a `ManualClock`).
        super().__init__(index=index, ttl=ttl)
        # Decoded vectors per namespace prefix, checked against the database's vector
        # generation on every search (`runstore.store.vectorcache`); none without an index.
        self._vectors = None if index is None else VectorCache(track_reloads=True)

    @classmethod
    async def open(
        cls,
        url: BackendURL,
        options: BackendOptions,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> PostgresStore:
        """Open ``postgresql://...``, creating the schema and tables or upgrading them as needed.

        ``index`` and ``ttl`` default to what `runstore.open` was given as ``store_index``
        and ``store_ttl``."""
        database = await shared_database(url, options)
        index, ttl = store_config(options, index, ttl)
        if options.migrate:
            await ensure_schema(database.engine, store_sql.COMPONENT, store_sql.MIGRATIONS)
        store = cls(database.engine, database.timeouts, index=index, ttl=ttl)
        store.loop = asyncio.get_running_loop()
        options.on_close(store.aclose)
        return store

    async def aclose(self) -> None:
        """Return the store's leased connections to the pool; later calls raise."""
        await self._leases.aclose()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order as one transaction (module docstring); one result per op."""
        steps = await prepare(ops, self.index_rules, store_sql.FILTERS)
        if not steps:
            return []
        dims = None if self.index_rules is None else self.index_rules.dims
        write = store_sql.writes(steps)
        puts = any(isinstance(step, PutStep) for step in steps)
        ctx = store_sql.Context(to_micros(self.now()), dims, None if puts else self._vectors)
        # One statement commits (or not) by itself: no BEGIN and COMMIT round trips.
        begin = None
        if not store_sql.one_statement(steps):
            begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        results: list[Result] = await settle(
            self._leases.run(
                lambda conn: store_sql.run_steps(conn, steps, ctx), operation="batch", write=write, begin=begin
            )
        )
        if self._vectors is not None:
            await self._fold(self._vectors.reloaded())
        return results

    async def _fold(self, prefixes: Sequence[tuple[str, ...]]) -> None:
        """Fold the change log under prefixes whose vectors a search just read again, so
        the next searches sum a row per namespace, not one per write (10,000 rows cost
        about 2 ms a search). Only an optimization: a failure is logged, not raised."""
        for prefix in prefixes:

            async def fold(conn: Any, prefix: tuple[str, ...] = prefix) -> None:
                await store_sql.fold(conn, prefix)

            try:
                await settle(
                    self._leases.run(fold, operation="fold vector changes", write=True, idempotent=True)
                )
            except Exception as exc:  # the search has its answer; the next sweep folds
                log.debug("%s: folding the vector change log failed: %s", BACKEND, exc)

    async def asweep_expired(self) -> int:
        """Delete the items whose TTL has passed (and their vectors); return how many."""
        now = to_micros(self.now())
        swept: int = await settle(
            self._leases.run(lambda conn: store_sql.sweep(conn, now), operation="sweep expired items", write=True)
        )
        return swept
