"""`SqliteStore`: LangGraph's long-term memory store (`BaseStore`) in a sqlite file.

The store shares the file (`SqliteFile`) with the saver, the event store and the run
store opened on the same URL: one engine, and one writer and write queue
(`runstore.plugins.sqlite.commits`). Each `abatch` is prepared first (validated and
embedded, `runstore.store.sqlbatch`), then runs whole on one thread hop:

* a batch with a put or delete is one op of the file's write queue, so it is one
  transaction (``BEGIN IMMEDIATE``, in a savepoint of its own when other stores' ops
  share the commit): all of it lands or none of it does;
* a read-only batch runs in one read transaction (one snapshot) on the file's writer
  while no write is queued, else on the store's own reader; the expiries its reads
  refresh are then written as one op.

A caller cancelled meanwhile does not stop its write: the op commits or rolls back
with its batch and the cancelled caller returns once it has
(`runstore.cancellation.settle`). Items past their expiry are invisible to reads and
deleted by `asweep_expired`. A file that cannot be used right now (busy past
``busy_timeout``, a full disk...) is `BackendUnavailableError`, nothing written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import ClassVar

from langgraph.store.base import IndexConfig, Op, Result, TTLConfig

from runstore.cancellation import settle
from runstore.clock import to_micros
from runstore.options import BackendOptions
from runstore.sql.migrations import Migration, ensure_schema
from runstore.store.base import StoreBase, store_config
from runstore.store.sqlbatch import PutStep, prepare
from runstore.store.vectorcache import VectorCache
from runstore.urls import BackendURL

from . import store_ops, vectors
from .adapter import WorkerConnection
from .errors import translated_errors
from .file import SqliteFile, shared_file
from .store_bulk import SqliteStoreBulk

BACKEND = "sqlite memory store"
_CLOSED = "this sqlite memory store is closed"


class SqliteStore(SqliteStoreBulk, StoreBase):
    """LangGraph `BaseStore` in a sqlite file: filters in SQL, TTL, semantic search.

    ``index={"dims", "embed", "fields"}`` enables semantic search (ranked with
    vectors cached in memory, sqlite-vec when those cannot decide:
    `runstore.plugins.sqlite.store_ops`); ``ttl`` is LangGraph's `TTLConfig`.
    """

    closed_message = _CLOSED

    #: URL query options the store accepts (none).
    url_options: ClassVar[frozenset[str]] = frozenset()
    schema_component: ClassVar[str | None] = store_ops.COMPONENT
    file_scheme: ClassVar[str | None] = "sqlite"
    schema_migrations: ClassVar[Sequence[Migration]] = store_ops.MIGRATIONS

    def __init__(
        self,
        file: SqliteFile,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        self._file = file
        self.engine = file.engine
        # The checked index and TTL rules, the clock (tests swap in a `ManualClock`).
        super().__init__(index=index, ttl=ttl)
        self._reader: WorkerConnection | None = None
        self._writing = False
        self._vec = False
        # Decoded vectors per namespace prefix, checked against the file's generation on
        # every search (`runstore.store.vectorcache`); none without an index.
        self._vectors = None if index is None else VectorCache()

    @classmethod
    async def open(
        cls,
        url: BackendURL,
        options: BackendOptions,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> SqliteStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed.

        ``index`` and ``ttl`` default to what `runstore.open` was given as ``store_index``
        and ``store_ttl``."""
        file = await shared_file(url, options, cls.url_options)
        index, ttl = store_config(options, index, ttl)
        if options.migrate:
            await ensure_schema(file.engine, store_ops.COMPONENT, store_ops.MIGRATIONS)
        store = cls(file, index=index, ttl=ttl)
        await store._start()
        options.on_close(store.aclose)
        return store

    async def _start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._reader = await WorkerConnection.checkout(self._file.engine)
        try:
            self._vec = await self._reader.run(vectors.available)
            await self._file.commits.acquire()
        except BaseException:
            await self._reader.close()
            self._reader = None
            raise
        self._writing = True

    async def aclose(self) -> None:
        """Give the file's writer and the store's reader back (idempotent)."""
        reader, self._reader = self._reader, None
        writing, self._writing = self._writing, False
        if writing:
            await self._file.commits.release()
        if reader is not None:
            await reader.close()

    # --- the BaseStore contract -------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order as one transaction (module docstring); one result per op."""
        steps = await prepare(ops, self.index_rules, store_ops.FILTERS)
        if not steps:
            return []
        reader = self._reader
        if reader is None or not self._writing:
            raise RuntimeError(_CLOSED)
        now = to_micros(self.now())
        dims = None if self.index_rules is None else self.index_rules.dims
        commits = self._file.commits
        with translated_errors(BACKEND, "batch"):
            if any(isinstance(step, PutStep) for step in steps):
                ctx = store_ops.Context(now, dims, self._vec, write=True)
                outcome: store_ops.Outcome = await settle(commits.submit(store_ops.write_batch, steps, ctx))
            else:
                ctx = store_ops.Context(now, dims, self._vec, cache=self._vectors)
                outcome = await commits.read(reader, store_ops.read_batch, steps, ctx)
                if outcome.refresh:
                    await settle(commits.submit(store_ops.refresh, outcome.refresh))
        return outcome.results

    async def asweep_expired(self) -> int:
        """Delete the items whose TTL has passed (and their vectors); return how many."""
        if not self._writing:
            raise RuntimeError(_CLOSED)
        now = to_micros(self.now())
        with translated_errors(BACKEND, "sweep expired items"):
            swept: int = await settle(self._file.commits.submit(store_ops.sweep, now))
        return swept
