"""PostgreSQL checkpoint saver on asyncpg: ``postgresql://user@host:5432/db?schema=app``.

Our own saver (not a wrapper of ``langgraph-checkpoint-postgres``). Rows are encoded
by the shared `runstore.checkpoint.codec`; SQL lives in `runstore.plugins.postgres.sql`,
connection leasing in `runstore.plugins.postgres.connections`. The round-trip budget:

* ``aput`` is ONE statement (blobs CTEs + checkpoint upsert), so one round trip and
  one WAL flush per checkpoint; ``aput_writes`` is one ``INSERT ... SELECT unnest``.
  Writes that arrive while another commits go out together in the next commit
  (`runstore.batching`).
* ``aget_tuple`` / ``alist`` read checkpoint, blobs and writes in one query; the head
  comes with its delta history (`runstore.checkpoint.prefetch`). ``aget_tuple`` calls
  that arrive while another read runs go out together in the next round trip (one
  pipelined ``fetchmany``), through a `BatchQueue` of their own.
* ``aget_delta_channel_history`` is one query (`runstore.plugins.postgres.history`).

Design notes and measurements: docs/savers.md, section "PostgreSQL".

This module holds the checkpoint reads and writes and the saver's life cycle; what
works on whole threads (deletion and fences, copy, prune, the thread index,
retention) is `runstore.plugins.postgres.threads.ThreadRecords`, a base class. SQL
text, connections and the history walk live in `sql`, `thread_sql`, `connections`
and `history`.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from runstore.batching import BatchQueue, Outcome
from runstore.checkpoint import codec
from runstore.checkpoint.prefetch import PrefetchStore
from runstore.checkpoint.rules import (
    config_address,
    config_fence,
    history_channels,
)
from runstore.checkpoint.threads import clock_micros
from runstore.clock import Clock, system_clock
from runstore.errors import BackendUnavailableError, StaleFenceError, ThreadDeletedError
from runstore.sql.migrations import Migration
from runstore.twins import ensure_off_loop
from runstore.urls import BackendURL

from . import sql
from .bulk import BulkRows
from .connections import PostgresCalls, Statement, one_at_a_time, run_statement_batch
from .engine import FromEngine, shared_database
from .history import walk_range
from .pooler_functions import statement_functions
from .settings import PostgresTimeouts
from .sql import COMPONENT, SCHEMA_MIGRATIONS
from .threads import ThreadRecords

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from runstore.options import BackendOptions

R = TypeVar("R")

__all__ = ["COMPONENT", "SCHEMA_MIGRATIONS", "PostgresSaver"]


class PostgresSaver(BulkRows, ThreadRecords, BaseCheckpointSaver[str], FromEngine):
    """LangGraph checkpoint saver on PostgreSQL (asyncpg), delta-safe, with sync twins.

    Open it with `PostgresSaver.open` (or ``runstore.open``); sync methods must be
    called from a thread other than the one running the saver's event loop.

    Examples:

    ```python
    import asyncio
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    from runstore.plugins.postgres.saver import PostgresSaver


    class State(TypedDict):
        count: int


    builder = StateGraph(State)
    builder.add_node("add_one", lambda state: {"count": state["count"] + 1})
    builder.add_edge(START, "add_one")


    async def main() -> None:
        async with PostgresSaver.from_conn_string("postgresql://app@localhost:5432/app") as saver:
            await saver.setup()  # create the tables (runstore.open does this for you)
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "thread-1"}}
            print(await graph.ainvoke({"count": 1}, config))  # {'count': 2}
            saved = await saver.aget_tuple(config)
            print(saved.checkpoint["channel_values"])  # {'count': 2}


    asyncio.run(main())
    ```

    `PostgresSaver.from_engine(engine)` runs it on your SQLAlchemy engine (never disposed here).
    """

    #: The thread index's clock (created/updated times); tests set a `ManualClock`.
    clock: Clock = staticmethod(system_clock)
    #: ``runstore.open`` does not put the delta history cache in front of this saver by
    #: default: it reads a thread's history in one trip, and measured no faster with the
    #: cache (docs/checkpoint-modes.md, "When runstore.open wraps").
    history_cache_helps: ClassVar[bool] = False
    schema_component: ClassVar[str | None] = COMPONENT
    schema_migrations: ClassVar[Sequence[Migration]] = SCHEMA_MIGRATIONS
    #: Leased connections kept between calls (each counts against the shared pool).
    MAX_IDLE_CONNECTIONS = 3
    #: Blob keys (thread, ns, channel, version) known to be stored, for carried values.
    KNOWN_BLOBS_MAX = 8192

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: BackendURL,
        serde: SerializerProtocol | None = None,
        max_idle: int | None = None,
        synchronous_commit: bool = True,
        timeouts: PostgresTimeouts | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.url = url
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self._leases = PostgresCalls(
            engine,
            self.MAX_IDLE_CONNECTIONS if max_idle is None else max_idle,
            backend="postgres saver",
            timeouts=timeouts or PostgresTimeouts(),
            synchronous_commit=synchronous_commit,
        )
        # One statement kind per batch: one executemany, one round trip, one commit. A
        # thread's writes that find the queue idle right after its own batch run at once in
        # the caller's task (every statement's first argument is its thread id).
        self._commits: BatchQueue[Statement] = BatchQueue(
            functools.partial(run_statement_batch, self._leases),
            kind=operator.itemgetter(0),
            inline_key=_thread_of,
        )
        # Reads too: the heads concurrent callers ask for while one read runs go out
        # together as one pipelined fetchmany (one round trip, rows told apart by key).
        self._reads: BatchQueue[Statement] = BatchQueue(
            self._read_batch, kind=operator.itemgetter(0), inline_key=_thread_of
        )
        self._prefetch = PrefetchStore()
        self._known: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        # The hot statements as sent; behind a transaction pooler, calls of the functions
        # wrapping them (`_call_functions`).
        self._put_sql = sql.PUT_SQL
        self._put_writes_sql = sql.PUT_WRITES_SQL
        self._get_latest_sql = sql.GET_LATEST_SQL
        self._get_by_id_sql = sql.GET_BY_ID_SQL
        self._behind_pooler = False

    @classmethod
    async def open(
        cls,
        url: BackendURL | str,
        options: BackendOptions,
        *,
        serde: SerializerProtocol | None = None,
    ) -> PostgresSaver:
        """Open the saver on ``url`` (creating/upgrading its tables) and register its cleanup."""
        from runstore.sql.migrations import ensure_schema

        database = await shared_database(url, options)
        if options.migrate:
            await ensure_schema(database.engine, COMPONENT, SCHEMA_MIGRATIONS)
        saver = cls(
            database.engine,
            url=database.url,
            serde=serde,
            synchronous_commit=database.settings.saver_synchronous_commit == "on",
            timeouts=database.timeouts,
        )
        options.on_close(saver.aclose)
        saver._behind_pooler = database.behind_pooler
        if saver._behind_pooler:
            await saver._call_functions(create=options.migrate)
        return saver

    async def setup(self) -> None:
        """Create or upgrade the saver's tables and, behind a transaction pooler, the
        functions wrapping its hot statements (`pooled`), which it then calls."""
        await super().setup()
        if self._behind_pooler:
            await self._call_functions(create=True)

    async def _call_functions(self, *, create: bool) -> None:
        """Send the hot statements as calls of functions wrapping them (`pooled`): behind a
        transaction pooler nothing else keeps their plans between calls."""
        hot = (sql.PUT_SQL, sql.PUT_WRITES_SQL, sql.GET_LATEST_SQL, sql.GET_BY_ID_SQL)

        async def go(conn: Any) -> Mapping[str, str]:
            return await statement_functions(
                conn, hot, schema_version=SCHEMA_MIGRATIONS[-1].version, create=create
            )

        calls = await self._leases.run(go, operation="open", write=create, idempotent=True)
        self._put_sql = calls.get(sql.PUT_SQL, sql.PUT_SQL)
        self._put_writes_sql = calls.get(sql.PUT_WRITES_SQL, sql.PUT_WRITES_SQL)
        self._get_latest_sql = calls.get(sql.GET_LATEST_SQL, sql.GET_LATEST_SQL)
        self._get_by_id_sql = calls.get(sql.GET_BY_ID_SQL, sql.GET_BY_ID_SQL)

    async def aclose(self) -> None:
        """Finish queued writes and give leased connections back to the shared engine
        (the engine closes with its options)."""
        await self._commits.wait_idle()
        await self._reads.wait_idle()
        await self._leases.aclose()

    def __repr__(self) -> str:
        return f"PostgresSaver({self.url})"

    # -- helpers -----------------------------------------------------------------

    def _decode_row(self, row: Any) -> CheckpointTuple:
        thread_id = row["thread_id"]
        ns = row["checkpoint_ns"]
        b_channels = row["b_channels"] or ()
        blobs = list(zip(b_channels, row["b_types"] or (), row["b_blobs"] or (), strict=True))
        w_task_ids = row["w_task_ids"]
        writes = (
            list(
                zip(
                    w_task_ids,
                    row["w_channels"],
                    row["w_types"],
                    row["w_blobs"],
                    row["w_paths"],
                    row["w_idxs"],
                    strict=True,
                )
            )
            if w_task_ids
            else None
        )
        return codec.decode_checkpoint(
            self.serde,
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=row["checkpoint_id"],
            parent_checkpoint_id=row["parent_checkpoint_id"],
            type=row["type"],
            checkpoint=row["checkpoint"],
            metadata=row["metadata"],
            blobs=blobs,
            writes=writes,
        )

    # -- async API -----------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the thread's latest without ``checkpoint_id``)."""
        thread_id, ns, checkpoint_id = config_address(config)
        args: tuple[str, ...]
        if checkpoint_id:
            statement, args = self._get_by_id_sql, (thread_id, ns, checkpoint_id)
        else:
            statement, args = self._get_latest_sql, (thread_id, ns)

        generation = self._prefetch.generation
        row = await self._reads.submit((statement, args))
        if row is None:
            return None
        need = None if checkpoint_id else row["h_need"]
        if need:
            rows = walk_range(row, row["checkpoint_id"], need, prefix="h_")
            if rows is not None:
                key = (thread_id, ns, row["checkpoint_id"])
                self._prefetch.store(key, generation, need, rows)
        return self._decode_row(row)

    async def _read_batch(self, batch: list[Statement]) -> list[Outcome]:
        """Run the `aget_tuple` reads of one statement for several callers; one outcome
        (the row or ``None``) per read, rows matched by address (the group-commit callback).

        Several reads go out as one ``fetchmany``: pipelined in one round trip, read in
        one snapshot. If that fails on a statement, each read runs alone, so only a
        read the server refuses fails; if the database is unavailable, every read gets
        that error.
        """
        statement = batch[0][0]
        leases = self._leases
        if len(batch) == 1:
            # The lone caller's read (group commit's inline op).
            try:
                row = await leases.query("fetchrow", (statement, *batch[0][1]), operation=_READ)
            except Exception as exc:
                return [(False, exc)]
            return [(True, row)]
        many = [args for _, args in batch]
        try:
            rows = await leases.query("fetchmany", (statement, many), operation=_READ)
        except BackendUnavailableError as exc:
            return [(False, exc)] * len(batch)
        except Exception:  # each read on its own, below
            pass
        else:
            width = len(many[0])
            found = {tuple(row[c] for c in _ADDRESS[:width]): row for row in rows}
            return [(True, found.get(tuple(args))) for args in many]

        async def alone(args: Sequence[Any]) -> Any:
            return await leases.query("fetchrow", (statement, *args), operation=_READ)

        return await one_at_a_time(many, alone)

    async def _list_rows(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[Any]:
        if limit is not None and limit <= 0:
            return []
        statement, args = sql.list_sql(config, filter, before, limit)

        async def go(conn: Any) -> list[Any]:
            return list(await conn.fetch(statement, *args))

        return await self._leases.run(go, operation="list")

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, filtered by thread/namespace, metadata and ``before`` in SQL
        (docs/savers.md, "Listing")."""
        for row in await self._list_rows(config, filter, before, limit):
            yield self._decode_row(row)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and its new channel values in one statement."""
        fence = config_fence(config)
        enc = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        row = enc.row
        thread_id, ns = row.thread_id, row.checkpoint_ns
        known = self._known
        carried = []
        for channel, version in enc.carried.items():
            key = (thread_id, ns, channel, version)
            if key in known:
                known.move_to_end(key)  # still in use: keep it from eviction
            else:
                carried.append(
                    codec.encode_blob(
                        self.serde, thread_id, ns, channel, version, enc.carried_values[channel]
                    )
                )
        blobs = enc.blobs
        *new_columns, new_bytes = _blob_columns(blobs) if blobs else _NO_BLOBS
        *carried_columns, carried_bytes = _blob_columns(carried) if carried else _NO_BLOBS
        args = (
            *row[:7],
            row.metadata,
            row.value_versions,
            *new_columns,
            *carried_columns,
            row.channel_versions,
            clock_micros(self.clock),
            len(row.checkpoint) + len(row.metadata) + new_bytes + carried_bytes,
            fence,
        )
        await self._write(self._put_sql, args, thread_id, fence)
        for b in (*blobs, *carried):
            key = (thread_id, ns, b.channel, b.version)
            known[key] = None
            known.move_to_end(key)
        while len(known) > self.KNOWN_BLOBS_MAX:
            known.popitem(last=False)
        return enc.config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes (first-write-wins; special channels last-write-wins)."""
        fence = config_fence(config)
        enc = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        if not writes:
            return
        # One statement cannot touch a row twice: keep the first of repeated normal
        # slots and the last of repeated special ones.
        rows: dict[int, codec.WriteRow] = {}
        for w in enc.first_wins:
            rows.setdefault(w.idx, w)
        for w in enc.last_wins:
            rows[w.idx] = w
        # Every row of one call has the same thread, namespace, checkpoint, task and path.
        threads, namespaces, ids, tasks, idxs, paths, channels, types, blobs = zip(
            *rows.values(), strict=True
        )
        thread_id = threads[0]
        args = (
            thread_id,
            namespaces[0],
            ids[0],
            tasks[0],
            paths[0],
            idxs,
            channels,
            types,
            blobs,
            clock_micros(self.clock),
            fence,
        )
        await self._write(self._put_writes_sql, args, thread_id, fence)

    async def _write(
        self, statement: str, args: tuple[Any, ...], thread_id: str, fence: int | None
    ) -> None:
        """Commit one write statement of ``thread_id`` through the group commit; a history
        prefetched before or during it is never used (`PrefetchStore.moved` on both sides),
        and a refusal by the database becomes runstore's error (`_refused`)."""
        # `PrefetchStore.writing` spelled out: a context manager is two more calls on the
        # path of every write.
        prefetch = self._prefetch
        prefetch.moved(thread_id)
        try:
            await self._commits.submit((statement, args))
        except Exception as exc:
            error = _refused(exc, thread_id, fence)
            if error is None:
                raise
            raise error from exc
        finally:
            prefetch.moved(thread_id)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel seed and ancestor writes, from one recursive query over parent links."""
        if not channels:
            return {}
        wanted = history_channels(channels)
        thread_id, ns, target = config_address(config)
        if target is not None:
            ready = self._prefetch.take((thread_id, ns, target), wanted)
            if ready is not None:
                # Decoded here, per call: callers never share value objects.
                return codec.assemble_delta_history(self.serde, channels, ready)

        rows: list[Any] | None = None
        if len(wanted) <= sql.MAX_MASK_CHANNELS:

            async def by_range(conn: Any) -> Any:
                return await conn.fetchrow(sql.RANGE_HISTORY_SQL, thread_id, ns, target, wanted)

            found = await self._leases.run(by_range, operation="get_delta_channel_history")
            rows = walk_range(found, found["target_id"], wanted)
        if rows is None:

            async def by_parent_links(conn: Any) -> list[Any]:
                return list(
                    await conn.fetch(sql.DELTA_HISTORY_SQL, thread_id, ns, target, wanted)
                )

            rows = await self._leases.run(
                by_parent_links, operation="get_delta_channel_history"
            )
        return codec.assemble_delta_history(self.serde, channels, rows)

    # -- sync twins ------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync twin of `aget_tuple` (call from a thread other than the saver's loop)."""
        return self._sync("get_tuple", lambda: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync twin of `alist` (call from a thread other than the saver's loop)."""
        # Check eagerly: a generator would only fail at its first next().
        ensure_off_loop(self.loop, "list", type(self).__name__)
        rows = self._sync("list", lambda: self._list_rows(config, filter, before, limit))
        return (self._decode_row(row) for row in rows)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync twin of `aput`."""
        return self._sync("put", lambda: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync twin of `aput_writes`."""
        self._sync("put_writes", lambda: self.aput_writes(config, writes, task_id, task_path))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Sync twin of `aget_delta_channel_history`."""
        return self._sync(
            "get_delta_channel_history",
            lambda: self.aget_delta_channel_history(config=config, channels=channels),
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Next channel version: the stock savers' zero-padded counter plus a random fraction."""
        return codec.next_version(current)


#: How errors name `aget_tuple`'s reads.
_READ = "get_tuple"
#: The columns of a read's row that name what it read, in the order of its arguments.
_ADDRESS = ("thread_id", "checkpoint_ns", "checkpoint_id")


def _thread_of(statement: Statement) -> Any:
    """The thread a write or head read is about: its statement's first argument."""
    return statement[1][0]


#: `_blob_columns` of no blobs: NULL arrays, which unnest to no rows like empty ones and
#: spare asyncpg its checks of an array parameter.
_NO_BLOBS: tuple[Any, ...] = (None, None, None, None, 0)


def _blob_columns(blobs: Sequence[codec.BlobRow]) -> tuple[Any, ...]:
    """The channel, version, type and blob arrays of a put's ``blobs`` (at least one) and
    their bytes."""
    _, _, channels, versions, types, data = zip(*blobs, strict=True)
    return channels, versions, types, data, sum(map(len, data))


def _refused(exc: Exception, thread_id: str, fence: int | None) -> Exception | None:
    """The runstore error a write's ``exc`` stands for when the database refused it:
    `ThreadDeletedError` (a tombstone refused it) or `StaleFenceError` (its token ``fence``
    was stale); ``None`` for any other error."""
    cause: BaseException | None = exc
    while cause is not None:
        state = getattr(cause, "sqlstate", None)
        if state == sql.THREAD_DELETED_SQLSTATE:
            return ThreadDeletedError(thread_id)
        if state == sql.STALE_FENCE_SQLSTATE and fence is not None:
            current = int(getattr(cause, "detail", None) or 0)
            return StaleFenceError(thread_id, fence, current)
        cause = cause.__cause__
    return None
