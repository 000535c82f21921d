"""`SqliteSaver`: a LangGraph checkpoint saver on one sqlite file (aiosqlite + stdlib sqlite3).

Every logical operation is one function of `runstore.plugins.sqlite.ops` run on the
aiosqlite worker thread (one hop, one transaction); concurrent writes are committed
together through the shared `runstore.batching.BatchQueue`. The sync
twins run the very same functions on a stdlib ``sqlite3`` connection from the
calling thread. Schema and SQL: `runstore.plugins.sqlite.sql`; connections:
`runstore.plugins.sqlite.connections`; decisions: docs/savers.md.

Why one module of this size: it holds only the saver's API (LangGraph's, plus the
thread index, retention and fencing) and its sync twins, each a call of one function
of `ops` on the worker or the sync connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
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

from runstore.checkpoint import codec
from runstore.checkpoint.policy import (
    Compaction,
    DryRun,
    RetentionPolicy,
    SweepBatch,
    batch_of,
    check_overrides,
    check_sweep,
)
from runstore.checkpoint.prefetch import PrefetchStore
from runstore.checkpoint.rules import (
    check_fence,
    check_prune_strategy,
    checked_ids,
    checked_text,
    config_address,
    config_fence,
    history_channels,
)
from runstore.checkpoint.threads import (
    Removed,
    ThreadInfo,
    ThreadPage,
    clock_micros,
    next_cursor,
    thread_info,
    thread_query,
)
from runstore.clock import Clock, system_clock
from runstore.sql.migrations import Migration, ensure_schema
from runstore.standalone import Standalone
from runstore.twins import ensure_off_loop

from . import ops, sql
from .adapter import WorkerConnection
from .bulk import SqliteBulkRows
from .commits import FileCommits
from .connections import SyncConnection, open_worker
from .errors import translated_error, translated_errors
from .file import shared_file
from .sql import SCHEMA_COMPONENT, SCHEMA_MIGRATIONS

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

R = TypeVar("R")

BACKEND = "sqlite saver"

__all__ = ["SCHEMA_COMPONENT", "SCHEMA_MIGRATIONS", "SqliteSaver"]

#: Checkpoints fetched per worker-thread hop while iterating `alist`.
_LIST_PAGE = 100


class _Pager:
    """Page sizes and keyset positions of one `alist`/`list` iteration."""

    def __init__(self, limit: int | None) -> None:
        self.remaining = limit
        self.after: tuple[str, str, str] | None = None

    def size(self) -> int:
        """The next page's size (0: done)."""
        if self.remaining is None:
            return _LIST_PAGE
        return max(0, min(_LIST_PAGE, self.remaining))

    def advance(self, fetched: list[ops.Fetched], size: int) -> bool:
        """Note a fetched page; whether another may follow."""
        if len(fetched) < size:
            return False
        if self.remaining is not None:
            self.remaining -= len(fetched)
        last = fetched[-1][0]
        self.after = (last[2], last[0], last[1])
        return True


class _State:
    """Connections, write queue and prefetched histories, shared by a saver and the
    shallow copies ``with_allowlist`` makes (LangGraph may call it when compiling)."""

    def __init__(self, sync: SyncConnection) -> None:
        self.worker: WorkerConnection | None = None
        self.sync = sync
        self.prefetch = PrefetchStore()
        # The file's writer and write queue, shared with the event store and run store
        # on the same file (`runstore.plugins.sqlite.file.SqliteFile`): set by `SqliteSaver.open`.
        self.file: FileCommits | None = None
        # This saver's writes submitted and not yet answered: closing waits for these
        # only (the shared queue may stay busy with the event store's appends).
        self.writes = 0
        self.writes_done = asyncio.Event()
        self.writes_done.set()
        # The engine's in-process write lock, shared with the other stores: writers
        # queue on it instead of polling sqlite's busy_timeout.
        self.write_lock: asyncio.Lock | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: AsyncEngine | None = None
        self.closed = False

    async def hop(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn(sqlite3_connection, *args)`` on the worker thread (one hop)."""
        if self.worker is None:
            raise RuntimeError("SqliteSaver is closed")
        return await self.worker.run(fn, *args)


class SqliteSaver(SqliteBulkRows, BaseCheckpointSaver[str], Standalone):
    """LangGraph checkpoint saver on a sqlite file: ``sqlite:///path/app.db``.

    Open it with `SqliteSaver.open` (or through `runstore.open`); it shares its
    SQLAlchemy engine with a sqlite event store on the same file. Async methods
    run one worker-thread hop each; sync twins use a stdlib ``sqlite3`` connection
    from the calling thread and refuse to run on the saver's event loop thread.

    Examples:

    ```python
    import asyncio
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    from runstore.plugins.sqlite.saver import SqliteSaver


    class State(TypedDict):
        count: int


    builder = StateGraph(State)
    builder.add_node("add_one", lambda state: {"count": state["count"] + 1})
    builder.add_edge(START, "add_one")


    async def main() -> None:
        async with SqliteSaver.from_conn_string("checkpoints.sqlite") as saver:
            await saver.setup()  # create the tables (runstore.open does this for you)
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "thread-1"}}
            print(await graph.ainvoke({"count": 1}, config))  # {'count': 2}
            saved = await saver.aget_tuple(config)
            print(saved.checkpoint["channel_values"])  # {'count': 2}


    asyncio.run(main())
    ```
    """

    #: The thread index's clock (created/updated times); tests set a `ManualClock`.
    clock: Clock = staticmethod(system_clock)
    #: ``runstore.open`` does not put the delta history cache in front of this saver by
    #: default: it reads a thread's history in one trip, and measured no faster with the
    #: cache (docs/checkpoint-modes.md, "When runstore.open wraps").
    history_cache_helps: ClassVar[bool] = False
    schema_component: ClassVar[str | None] = SCHEMA_COMPONENT
    file_scheme: ClassVar[str | None] = "sqlite"
    schema_migrations: ClassVar[Sequence[Migration]] = SCHEMA_MIGRATIONS

    def __init__(
        self,
        *,
        path: Path,
        serde: SerializerProtocol | None = None,
        synchronous: str = "normal",
        busy_timeout_ms: int = 5000,
    ) -> None:
        super().__init__(serde=serde)
        self.path = path
        self._state = _State(SyncConnection(path, synchronous, busy_timeout_ms))

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        url: BackendURL,
        options: BackendOptions,
        *,
        serde: SerializerProtocol | None = None,
    ) -> SqliteSaver:
        """Open (creating or upgrading the schema) the saver for ``url``; closed with ``options``."""
        file = await shared_file(url, options)
        engine = file.engine
        if options.migrate:
            await ensure_schema(engine, SCHEMA_COMPONENT, SCHEMA_MIGRATIONS)
        saver = cls(
            path=file.path,
            serde=serde,
            synchronous=file.settings.synchronous,
            busy_timeout_ms=file.settings.busy_timeout_ms,
        )
        state = saver._state
        state.worker = await open_worker(engine)
        state.file = file.commits
        try:
            await state.file.acquire()
        except BaseException:
            await state.worker.close()
            raise
        state.engine, state.write_lock = engine, file.write_lock
        state.loop = asyncio.get_running_loop()
        options.on_close(saver.aclose)
        return saver

    @property
    def engine(self) -> AsyncEngine | None:
        """The SQLAlchemy engine shared with a sqlite event store on the same file."""
        return self._state.engine

    async def aclose(self) -> None:
        """Finish queued writes, return the pooled connection, close the sync one (idempotent)."""
        state = self._state
        if state.closed:
            return
        state.closed = True  # new calls fail; writes already queued still commit
        await state.writes_done.wait()
        if state.file is not None:
            file, state.file = state.file, None
            await file.release()
        if state.worker is not None:
            worker, state.worker = state.worker, None
            await worker.close()
        state.sync.close()

    async def __aenter__(self) -> SqliteSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing ----------------------------------------------------------------

    async def _read(self, fn: Callable[..., R], *args: Any) -> R:
        """Run read op ``fn`` on the file's idle writer or this saver's worker (`FileCommits.read`)."""
        state = self._state
        if state.closed or state.worker is None or state.file is None:
            raise RuntimeError("SqliteSaver is closed")
        with translated_errors(BACKEND, fn.__name__):
            return await state.file.read(state.worker, fn, *args)

    async def _write(self, fn: Callable[..., Any], *args: Any, thread: str | None = None) -> Any:
        """Run write op ``fn`` in the next group commit; return once it has committed.

        ``thread``: the one thread the op writes, if it writes one; a delta history
        prefetched for another thread stays usable meanwhile (`PrefetchStore.writing`).
        """
        state = self._state
        if state.closed or state.file is None:
            raise RuntimeError("SqliteSaver is closed")
        state.writes += 1
        state.writes_done.clear()
        # `translated_errors` and `PrefetchStore.writing` spelled out: as context managers
        # they are four more calls on the path of every write.
        prefetch = state.prefetch
        prefetch.moved(thread)
        try:
            return await state.file.submit(fn, *args, key=thread)
        except sqlite3.Error as exc:
            error = translated_error(exc, BACKEND, fn.__name__)
            if error is None:
                raise
            raise error from exc
        finally:
            prefetch.moved(thread)
            state.writes -= 1
            if not state.writes:
                state.writes_done.set()

    def _sync_read(self, method: str, fn: Callable[..., R], *args: Any) -> R:
        ensure_off_loop(self._state.loop, method, type(self).__name__)
        with translated_errors(BACKEND, method):
            return self._state.sync.run(fn, *args)

    def _sync_write(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        ensure_off_loop(self._state.loop, method, type(self).__name__)
        with translated_errors(BACKEND, method):
            with self._state.prefetch.writing():
                [(ok, value)] = self._state.sync.run(ops.write_batch, [(fn, args)])
            if not ok:
                raise value
            return value

    def _decode(self, fetched: ops.Fetched) -> CheckpointTuple:
        record, blobs, writes = fetched
        return codec.decode_checkpoint(
            self.serde,
            thread_id=record[0],
            checkpoint_ns=record[1],
            checkpoint_id=record[2],
            parent_checkpoint_id=record[3],
            type=record[4],
            checkpoint=record[5],
            metadata=record[6],
            blobs=blobs,
            writes=writes,
        )

    def _got(self, got: ops.Got | None, generation: int) -> CheckpointTuple | None:
        """Decode `ops.get`'s answer and keep its prefetched delta history, if any."""
        if got is None:
            return None
        fetched, history = got
        if history is not None:
            record = fetched[0]
            self._state.prefetch.store((record[0], record[1], record[2]), generation, *history)
        return self._decode(fetched)

    # -- async API ---------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (latest of the thread without ``checkpoint_id``)."""
        generation = self._state.prefetch.generation
        thread_id, ns, checkpoint_id = config_address(config)
        # Prefetch only for the thread's latest checkpoint (how a run starts): a walk
        # that loads ancestors one by one would otherwise pay for a history each.
        got = await self._read(ops.get, thread_id, ns, checkpoint_id, checkpoint_id is None)
        return self._got(got, generation)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints matching ``config``/``filter``/``before``, newest first, at most ``limit``
        (docs/savers.md, "Listing")."""
        where, params = sql.list_where(config, filter, before)
        pager = _Pager(limit)
        while size := pager.size():
            fetched = await self._read(ops.list_page, where, params, pager.after, size)
            for item in fetched:
                yield self._decode(item)
            if not pager.advance(fetched, size):
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (record + blobs of ``new_versions``) under ``config``'s parent."""
        fence = config_fence(config)
        encoded = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        await self._write(
            ops.put, encoded, self.serde, clock_micros(self.clock), fence,
            thread=encoded.row.thread_id,
        )  # fmt: skip
        return encoded.config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store pending writes of ``task_id`` (first write wins; special channels last wins)."""
        fence = config_fence(config)
        encoded = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        if encoded.first_wins or encoded.last_wins:
            thread = (encoded.first_wins or encoded.last_wins)[0].thread_id
            await self._write(ops.put_writes, encoded, clock_micros(self.clock), fence, thread=thread)

    async def adelete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Delete every checkpoint, blob and write of ``thread_id``; with ``fence``, refused
        (`StaleFenceError`) if the thread has seen a newer token."""
        ids = [checked_text(thread_id, "thread_id")]
        token = None if fence is None else check_fence(fence)
        await self._write(ops.delete_threads, ids, clock_micros(self.clock), token, thread=ids[0])

    async def afence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` without writing anything else: from now on
        writes carrying an older token are refused. `StaleFenceError` if it holds a newer one."""
        thread_id, fence = checked_text(thread_id, "thread_id"), check_fence(fence)
        await self._write(ops.fence_thread, thread_id, clock_micros(self.clock), fence, thread=thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (whole parent chain), blob and write to another thread.

        On a checkpoint id present in both threads the source's copy wins.
        """
        source = checked_text(source_thread_id, "source_thread_id")
        target = checked_text(target_thread_id, "target_thread_id")
        await self._write(ops.copy_thread, source, target, clock_micros(self.clock), thread=target)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: per namespace keep the latest checkpoint and every ancestor its
        delta reconstruction reads (with their writes); ``delete``: drop the threads."""
        ids = checked_ids(thread_ids, "thread_ids")
        if check_prune_strategy(strategy) == "delete":
            await self._write(ops.delete_threads, ids, clock_micros(self.clock))
        else:
            await self._write(ops.prune_keep_latest, ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete checkpoints (and writes) whose ``run_id`` is in ``run_ids``, keeping
        ancestors a surviving checkpoint's delta reconstruction still reads."""
        if ids := checked_ids(run_ids, "run_ids"):
            await self._write(ops.delete_for_runs, ids)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel writes and seed along the target's parent chain, in one statement."""
        if not channels:
            return {}
        wanted = history_channels(channels)
        thread_id, ns, checkpoint_id = config_address(config)
        prefetched = None
        if checkpoint_id is not None:
            prefetched = self._state.prefetch.take((thread_id, ns, checkpoint_id), wanted)
        rows = (
            prefetched
            if prefetched is not None
            else await self._read(ops.delta, thread_id, ns, checkpoint_id, wanted)
        )
        return codec.assemble_delta_history(self.serde, channels, rows)

    # -- thread index ------------------------------------------------------------

    async def aget_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread's index record, or ``None`` if it has no checkpoint (or was deleted)."""
        row = await self._read(ops.get_thread, checked_text(thread_id, "thread_id"))
        return None if row is None else thread_info(*row[:1], **_thread_fields(row))

    async def alist_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """One page of threads, newest first by ``order_by`` (docs/threads.md)."""
        query = thread_query(
            filter=filter,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            order_by=order_by,
            limit=limit,
            cursor=cursor,
        )
        rows = await self._read(ops.list_threads, *sql.list_threads_sql(query))
        threads = [thread_info(*row[:1], **_thread_fields(row)) for row in rows]
        return ThreadPage(threads, next_cursor(query, threads))

    # -- retention ---------------------------------------------------------------

    async def aset_thread_retention(
        self, thread_id: str, overrides: Mapping[str, Any] | None
    ) -> None:
        """Store retention overrides with the thread (``None`` clears them; docs/threads.md)."""
        text = check_overrides(overrides)
        thread = checked_text(thread_id, "thread_id")
        await self._write(ops.set_retention, thread, text, clock_micros(self.clock), thread=thread)

    async def atouch_thread(self, thread_id: str) -> bool:
        """Count a read as activity: ``touched_at`` (where ``idle_ttl`` counts from) becomes
        now; whether the thread exists (docs/threads.md)."""
        thread = checked_text(thread_id, "thread_id")
        touched = await self._write(ops.touch_thread, thread, clock_micros(self.clock), thread=thread)
        return bool(touched)

    async def asweep(
        self,
        policy: RetentionPolicy,
        *,
        after: str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        claim_seconds: float = 300.0,
        rescan: bool = False,
        thread_ids: Sequence[str] | None = None,
    ) -> SweepBatch:
        """One bounded batch of a retention sweep (`runstore.sweeper` runs the passes):
        claims up to ``limit`` threads after ``after`` and applies ``policy`` to each live
        one in a transaction of its own; a ``dry_run`` claims nothing and rolls back."""
        claim = check_sweep(policy, limit, claim_seconds)
        only = None if thread_ids is None else checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        if dry_run:
            claimed = await self._read(
                ops.sweep_claim, policy, now, after, limit, None, rescan, only
            )
        else:
            until = now + claim
            claimed = await self._write(
                ops.sweep_claim, policy, now, after, limit, until, rescan, only
            )
        swept = []
        for thread_id, deleted in claimed:
            if deleted:
                continue
            try:
                swept.append(
                    await self._write(
                        ops.sweep_thread, thread_id, policy, now, dry_run, thread=thread_id
                    )
                )
            except DryRun as answer:
                swept.append(answer.swept)
        return batch_of(claimed, swept, limit)

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """`adelete_thread` for several threads, answering what went (a dry run only counts)."""
        ids = checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        if dry_run:
            return await self._read(ops.purge_threads, ids, now, True)
        return await self._write(ops.purge_threads, ids, now)

    async def acompact(self, *, full: bool = False) -> Compaction:
        """Give the space deletions freed back to the file system (docs/threads.md,
        "Giving disk back"); the file's size (with its WAL) before and after."""
        if self._state.closed:
            raise RuntimeError("SqliteSaver is closed")
        before = _file_bytes(self.path)
        if self._state.write_lock is None:
            await self._state.hop(ops.compact, full)
        else:
            async with self._state.write_lock:
                await self._state.hop(ops.compact, full)
        return Compaction(before, _file_bytes(self.path))

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Mark deleted threads whose events and stream keys are gone as done (the sweeper)."""
        if ids := checked_ids(thread_ids, "thread_ids"):
            await self._write(ops.finish_cleanup, ids, clock_micros(self.clock))

    # -- sync twins --------------------------------------------------------------

    def set_thread_retention(self, thread_id: str, overrides: Mapping[str, Any] | None) -> None:
        """Sync twin of `aset_thread_retention` (not on the saver's event loop thread)."""
        text = check_overrides(overrides)
        thread = checked_text(thread_id, "thread_id")
        self._sync_write(
            "set_thread_retention", ops.set_retention, thread, text, clock_micros(self.clock)
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync twin of `aget_tuple` (not on the saver's event loop thread)."""
        got = self._sync_read("get_tuple", ops.get, *config_address(config), False)
        return None if got is None else self._decode(got[0])

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync twin of `alist` (not on the saver's event loop thread)."""
        # Checked eagerly: a generator would only fail at its first next().
        ensure_off_loop(self._state.loop, "list", type(self).__name__)
        where, params = sql.list_where(config, filter, before)
        return self._list_sync(where, params, limit)

    def _list_sync(
        self, where: Sequence[str], params: Sequence[Any], limit: int | None
    ) -> Iterator[CheckpointTuple]:
        pager = _Pager(limit)
        while size := pager.size():
            fetched = self._sync_read("list", ops.list_page, where, params, pager.after, size)
            for item in fetched:
                yield self._decode(item)
            if not pager.advance(fetched, size):
                return

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync twin of `aput` (not on the saver's event loop thread)."""
        fence = config_fence(config)
        encoded = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        self._sync_write("put", ops.put, encoded, self.serde, clock_micros(self.clock), fence)
        return encoded.config

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync twin of `aput_writes` (not on the saver's event loop thread)."""
        fence = config_fence(config)
        encoded = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        if encoded.first_wins or encoded.last_wins:
            self._sync_write(
                "put_writes", ops.put_writes, encoded, clock_micros(self.clock), fence
            )

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Sync twin of `adelete_thread` (not on the saver's event loop thread)."""
        ids = [checked_text(thread_id, "thread_id")]
        token = None if fence is None else check_fence(fence)
        self._sync_write("delete_thread", ops.delete_threads, ids, clock_micros(self.clock), token)

    def fence_thread(self, thread_id: str, fence: int) -> None:
        """Sync twin of `afence_thread` (not on the saver's event loop thread)."""
        thread_id, fence = checked_text(thread_id, "thread_id"), check_fence(fence)
        self._sync_write("fence_thread", ops.fence_thread, thread_id, clock_micros(self.clock), fence)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync twin of `acopy_thread` (not on the saver's event loop thread)."""
        source = checked_text(source_thread_id, "source_thread_id")
        target = checked_text(target_thread_id, "target_thread_id")
        self._sync_write("copy_thread", ops.copy_thread, source, target, clock_micros(self.clock))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync twin of `aprune` (not on the saver's event loop thread)."""
        ids = checked_ids(thread_ids, "thread_ids")
        if check_prune_strategy(strategy) == "delete":
            self._sync_write("prune", ops.delete_threads, ids, clock_micros(self.clock))
        else:
            self._sync_write("prune", ops.prune_keep_latest, ids)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync twin of `adelete_for_runs` (not on the saver's event loop thread)."""
        if ids := checked_ids(run_ids, "run_ids"):
            self._sync_write("delete_for_runs", ops.delete_for_runs, ids)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Sync twin of `aget_delta_channel_history` (not on the saver's event loop thread)."""
        if not channels:
            return {}
        rows = self._sync_read(
            "get_delta_channel_history",
            ops.delta,
            *config_address(config),
            history_channels(channels),
        )
        return codec.assemble_delta_history(self.serde, channels, rows)

    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """Sync twin of `aget_thread` (not on the saver's event loop thread)."""
        row = self._sync_read("get_thread", ops.get_thread, checked_text(thread_id, "thread_id"))
        return None if row is None else thread_info(*row[:1], **_thread_fields(row))

    def list_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """Sync twin of `alist_threads` (not on the saver's event loop thread)."""
        query = thread_query(
            filter=filter,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            order_by=order_by,
            limit=limit,
            cursor=cursor,
        )
        rows = self._sync_read("list_threads", ops.list_threads, *sql.list_threads_sql(query))
        threads = [thread_info(*row[:1], **_thread_fields(row)) for row in rows]
        return ThreadPage(threads, next_cursor(query, threads))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A new channel version string after ``current`` (stock-saver compatible shape)."""
        return codec.next_version(current)


def _file_bytes(path: Path) -> int:
    """A database file's size with its WAL (0 for what does not exist)."""
    total = 0
    for candidate in (path, path.with_name(path.name + "-wal")):
        try:
            total += candidate.stat().st_size
        except FileNotFoundError:
            pass
    return total


def _thread_fields(row: Sequence[Any]) -> dict[str, Any]:
    """`thread_info` keywords from a row in `sql.THREAD_INFO_COLUMNS` order."""
    names = [c.strip() for c in sql.THREAD_INFO_COLUMNS.split(",")][1:]
    return dict(zip(names, row[1:], strict=True))
