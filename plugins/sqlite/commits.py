"""The file's group commit: the writes of every sqlite store on one engine, committed together.

The saver, the event store and the run store opened on one file share one writer
connection and one `runstore.batching.BatchQueue` queue, held by the file's
`runstore.plugins.sqlite.file.SqliteFile`. Under load a
turn's checkpoint writes and its journal append land in the same transaction as
other threads' writes: one worker-thread hop, one ``BEGIN IMMEDIATE`` and one
``COMMIT`` for the whole batch, where each store committing on its own paid one of
each per call and queued its transactions one behind the other on the file's write
lock anyway. Each op still runs in its own savepoint (`ops.write_batch`), so a failing
op fails only its own caller; a run store's script (its checks and writes) is one op,
so its decisions stay one atomic step.

A caller working alone (its op finds the queue idle right after a batch of ops of the
same key, the thread the op writes) runs its op in its own task, the `BatchQueue`
inline path: without it every write of a lone caller took two more event-loop hops (to
the batch task and back), on the critical path of LangGraph's chained puts. Cancelling
that caller cannot cut the op short: `WorkerConnection.run` lets the op end (its
transaction commits or rolls back whole) before the cancellation is raised, which is
what the queue promises its cancelled callers either way.

Reads take the writer too while the queue is idle (`FileCommits.read`). Each store also
holds a reader connection of its own, but in WAL mode a connection drops its whole page
cache when it starts reading after another connection committed, so a reader that
follows every write re-reads each page it needs from the file: in the one-thread delta
graph that made the head's read (checkpoint and delta history) about 0.1 ms slower than
on the connection that had just written those pages. While a batch is queued or running,
reads go to the store's reader instead and never wait behind it.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.batching import BatchQueue, Outcome

from . import ops
from .adapter import WorkerConnection
from .connections import open_worker

R = TypeVar("R")


class _Queued(NamedTuple):
    """A write op in the file's queue, with the key it may run inline under."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    #: The thread the op writes (``None``: several or none; never run inline).
    key: Hashable


class FileCommits:
    """One engine's writer connection and write queue, held while a store uses them.

    Stores call `acquire` when they open and `release` when they close; the writer is
    checked out of the pool by the first and returned by the last. Batches queue on
    ``lock`` (the engine's in-process write lock) before ``BEGIN IMMEDIATE``.
    """

    def __init__(self, engine: AsyncEngine, lock: asyncio.Lock | None) -> None:
        self._engine = engine
        self._lock = lock
        self._writer: WorkerConnection | None = None
        self._users = 0
        self._opening = asyncio.Lock()
        #: The queue every store's write op joins (tests reach in to cancel a batch).
        self.queue: BatchQueue[_Queued] = BatchQueue(
            self._run_batch,
            settle_on_cancel=True,
            inline_key=operator.attrgetter("key"),
            gather_ready=True,
        )

    async def acquire(self) -> None:
        """Count a store as a user, checking the writer out for the first."""
        async with self._opening:
            if self._writer is None:
                self._writer = await open_worker(self._engine)
            self._users += 1

    async def release(self) -> None:
        """Uncount a store; the last one waits for queued writes and returns the writer."""
        async with self._opening:
            self._users -= 1
            if self._users > 0:
                return
            await self.queue.wait_idle()
            writer, self._writer = self._writer, None
            if writer is not None:
                await writer.close()

    async def submit(self, fn: Callable[..., Any], *args: Any, key: Hashable = None) -> Any:
        """Run ``fn(conn, *args)`` in the next batch; return its result once committed.
        ``key``: the thread the op writes, if one (a lone caller's op then runs inline).

        A caller cancelled while its op is queued withdraws it (it never runs); one
        cancelled once its batch runs gets its cancellation when that batch has ended
        (the op committed or failed with it), so a returned or cancelled call is over:
        nothing of it lands afterwards and no write lock is held for it (`BatchQueue`
        with ``settle_on_cancel``).
        """
        return await self.queue.submit(_Queued(fn, args, key))

    async def read(self, reader: WorkerConnection, fn: Callable[..., R], *args: Any) -> R:
        """Run read ``fn(conn, *args)`` on the file's writer if no write is queued or
        running, else on ``reader``, the calling store's own connection (module docstring)."""
        writer = self._writer
        if writer is not None and not self.queue.busy:
            return await writer.run(fn, *args)
        return await reader.run(fn, *args)

    async def _run_batch(self, batch: list[_Queued]) -> list[Outcome]:
        writer = self._writer
        if writer is None:
            raise RuntimeError("the sqlite file's writer is closed")
        write_ops: list[ops.WriteOp] = [(op.fn, op.args) for op in batch]
        if self._lock is None:
            return await writer.run(ops.write_batch, write_ops)
        async with self._lock:
            return await writer.run(ops.write_batch, write_ops)

