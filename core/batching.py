"""Group commit: concurrent writes of one saver share one transaction and one commit.

The one batching mechanism of runstore: the SQL savers' writes and grouped reads, the
PostgreSQL event store's appends and the Redis stream bridge's shared pipeline (a batch is
one round trip there) all queue here; only the "run this batch" callback differs.

LangGraph saves a step's ``aput_writes`` and the chained ``aput`` calls in the
background, so several writes of one saver are often in flight at once, and each
commit waits for the disk (an fsync or a WAL flush). `BatchQueue` queues the writes
that arrive while a batch runs and hands the whole queue to the backend's
``run_batch`` callback as the next batch: one transaction, one commit. Every caller
still returns only after its own op has committed (or raises its own op's error).

Cancellation (the rule every saver built on this inherits):

* Batches run in a task of their own, never in a caller's task, so cancelling a
  caller never interrupts a batch: the batch's transaction commits or rolls back as
  a whole, and the connection is never left inside it.
* A caller cancelled while its op waits in the queue withdraws it: the op never
  runs (fully absent).
* A caller cancelled once its op was taken into a batch stops waiting, nothing
  more: the op commits or fails with its batch exactly as if the caller had
  waited (fully committed or fully absent, never half). With
  ``settle_on_cancel=True`` the cancelled caller first waits for that batch to end
  (`runstore.cancellation.wait_until_done`: further cancellations wait too), so when
  the cancellation reaches the caller nothing of its op is still in flight: the event
  store promises that.

With an ``inline_key`` function (the PostgreSQL saver's: the op's thread), an op that
arrives while nothing is queued or running, and whose key is the one every op of the
last batch had, is a batch of one and runs in its caller's task, without the hop to
the batch task and back. Each hop waits behind whatever else the event loop has ready:
in a LangGraph run, the graph's own work, on the critical path of the chained ``aput``
calls. The key test keeps it to a caller working alone: with concurrent callers the
last batch held other keys, and the op queues, so a burst of callers shares one batch
(measured at 32 threads, inlining every op that found the queue idle split each
burst into a lone op and the rest, and the extra commits cost more server and worker
CPU than the hops saved). An inline batch holds no other caller's op, so a
cancellation may interrupt it: the backend callback must then leave the op whole or
absent, as a single call does (the PostgreSQL saver's `PostgresCalls` rolls the statement
back, or it committed whole before the cancel arrived). Ops that arrive meanwhile
queue for the next batch, which starts when the inline one ends, however it ends.

With a ``kind`` function, a batch holds only ops of one kind: the kind of the oldest
queued op, all of its queued ops in arrival order; the others wait for the next
batch, where the ops that arrive meanwhile join them. The PostgreSQL saver gives
each statement its kind, so every batch is one ``executemany``: one round trip and
one commit, where a batch mixing a checkpoint and a pending-writes statement would
pay two of each (or ``BEGIN`` and ``COMMIT`` round trips around them). Ops still
queued are concurrent (each caller waits for its op before sending another), so
any order among them is one a caller could have seen.

With ``gather_ready``, the batch task lets every task that is ready run once before it
takes a batch, so ops being prepared in this pass of the event loop join the batch
instead of waiting for the next one. The sqlite file's queue asks for it: its batch
runs on a worker thread that needs the GIL, so a batch handed over while the loop is
busy (LangGraph encoding the next checkpoint right after the previous put returned)
waits for the loop anyway, and the op being encoded would then need a batch of its own.
A PostgreSQL batch goes to the server at once and runs there while the loop works.

The backend callback receives the ops in arrival order and returns one outcome per
op, ``(True, result)`` or ``(False, exception)``, so a failing op fails only its own
caller (the sqlite saver runs each op in a savepoint; the PostgreSQL saver re-runs a
failed batch one op at a time). If the callback itself raises, every op of the
batch gets that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from runstore.cancellation import wait_until_done
from runstore.moved import renamed_attribute

__all__ = ["BatchQueue", "Outcome"]

Op = TypeVar("Op")

#: One op's result: ``(True, value)`` when it committed, ``(False, exception)`` when not.
Outcome = tuple[bool, Any]


class _Pending(Generic[Op]):
    """One queued op, the future its caller waits on (compared by identity) and, once
    taken into a batch, a future done when that batch has ended."""

    __slots__ = ("batch", "future", "op")

    def __init__(self, op: Op, future: asyncio.Future[Any]) -> None:
        self.op = op
        self.future = future
        self.batch: asyncio.Future[None] | None = None


class BatchQueue(Generic[Op]):
    """A FIFO of write ops run in batches by ``run_batch``, one batch at a time.

    ``run_batch(ops)`` must run every op in one transaction (or each alone, its
    choice) and return one `Outcome` per op, in order. It is never cancelled by a
    caller, except a batch of one run inline (``inline_key``); otherwise it is
    cancelled only if its task is (the event loop shutting down). With ``kind``, each
    batch holds ops of one kind only (module docstring).
    """

    def __init__(
        self,
        run_batch: Callable[[list[Op]], Awaitable[Sequence[Outcome]]],
        *,
        kind: Callable[[Op], Hashable] | None = None,
        settle_on_cancel: bool = False,
        inline_key: Callable[[Op], Hashable] | None = None,
        gather_ready: bool = False,
    ) -> None:
        self._run_batch = run_batch
        self._kind = kind
        self._settle_on_cancel = settle_on_cancel
        self._inline_key = inline_key
        self._gather_ready = gather_ready
        self._queue: list[_Pending[Op]] = []
        self._drainer: asyncio.Task[None] | None = None
        # Whether an inline op runs, and the future `wait_idle` waits on meanwhile (made
        # only then: most inline ops end with nobody waiting).
        self._inline = False
        self._inline_ended: asyncio.Future[None] | None = None
        # The key every op of the last batch had (None: several, or no batch yet).
        self._last_key: Hashable | None = None

    async def submit(self, op: Op) -> Any:
        """Queue ``op`` for the next batch and return its result once it has committed."""
        idle = self._drainer is None and not self._inline
        if (
            idle
            and self._last_key is not None
            and self._inline_key is not None
            and self._inline_key(op) == self._last_key
        ):
            # A batch of one in the caller's task (module docstring).
            self._inline = True
            try:
                [(ok, value)] = _checked(await self._run_batch([op]), 1)
            finally:
                self._inline_ended_now()
            if ok:
                return value
            raise value
        pending = self._append(op)
        try:
            return await pending.future
        except asyncio.CancelledError:
            # Still queued: cancelling the await cancelled the future, and the drainer
            # skips cancelled futures when it takes the next batch, so the op never runs.
            # Already taken: the batch goes on; only the outcome is dropped.
            if pending.future.done() and not pending.future.cancelled():
                pending.future.exception()  # retrieved: no "never retrieved" warning
            if self._settle_on_cancel and pending.batch is not None:
                await wait_until_done(pending.batch)
            raise

    def post(self, op: Op) -> asyncio.Future[Any]:
        """Queue ``op`` for the next batch without waiting for it: the returned future holds
        its result (or error). Cancelling the future while the op is queued withdraws it."""
        return self._append(op).future

    def _append(self, op: Op) -> _Pending[Op]:
        """Queue ``op`` and start the batch task if none runs."""
        idle = self._drainer is None and not self._inline
        pending = _Pending(op, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        if idle:
            self._start_drainer()
        return pending

    def _inline_ended_now(self) -> None:
        """An inline op ended, however: wake `wait_idle`, start the ops queued meanwhile."""
        self._inline = False
        if self._inline_ended is not None:
            self._inline_ended.set_result(None)
            self._inline_ended = None
        if self._queue and self._drainer is None:
            self._start_drainer()

    def _start_drainer(self) -> None:
        """Start the batch task for the queued ops."""
        drainer = asyncio.get_running_loop().create_task(self._drain())
        drainer.add_done_callback(self._drainer_done)
        self._drainer = drainer

    def _drainer_done(self, drainer: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never runs `_drain` (nor its cleanup, which
        # clears `_drainer`): its queued callers would wait forever. Only the loop shutting
        # down does that. Once `_drain` has run, it answered its callers itself, and the
        # queue may already belong to a newer task.
        if self._drainer is drainer:
            self._drainer = None
            if drainer.cancelled():
                self._cancel_waiters([])

    def _batch_key(self, batch: list[_Pending[Op]]) -> Hashable | None:
        """The key every op of ``batch`` has, or ``None`` (several, or no ``inline_key``)."""
        inline_key = self._inline_key
        if inline_key is None:
            return None
        key = inline_key(batch[0].op)
        for p in batch[1:]:
            if inline_key(p.op) != key:
                return None
        return key

    @property
    def busy(self) -> bool:
        """Whether a batch is running or queued."""
        return self._drainer is not None or self._inline

    async def wait_idle(self) -> None:
        """Wait until every queued op has been run and answered (for closing a saver)."""
        while True:
            if self._inline:
                if self._inline_ended is None:
                    self._inline_ended = asyncio.get_running_loop().create_future()
                running: asyncio.Future[None] = self._inline_ended
            elif self._drainer is not None:
                running = self._drainer
            else:
                return
            await asyncio.shield(running)

    async def _drain(self) -> None:
        # One coroutine for the whole batch (no helper coroutine around `run_batch`): the
        # event loop resumes every coroutine of the chain at each of its suspensions.
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                if self._gather_ready:
                    try:
                        await asyncio.sleep(0)
                    except asyncio.CancelledError:
                        self._cancel_waiters([])
                        raise
                batch = self._take_batch()
                if not batch:
                    continue
                ended: asyncio.Future[None] = loop.create_future()
                for p in batch:
                    p.batch = ended
                try:
                    try:
                        ops = [p.op for p in batch]
                        outcomes = _checked(await self._run_batch(ops), len(ops))
                    except asyncio.CancelledError:
                        self._cancel_waiters(batch)
                        raise
                    except Exception as exc:
                        outcomes = [(False, exc)] * len(batch)
                    for p, (ok, value) in zip(batch, outcomes, strict=True):
                        if p.future.done():  # its caller was cancelled while the batch ran
                            continue
                        if ok:
                            p.future.set_result(value)
                        else:
                            p.future.set_exception(value)
                finally:
                    ended.set_result(None)
                self._last_key = self._batch_key(batch)
        finally:
            self._drainer = None

    def _cancel_waiters(self, batch: list[_Pending[Op]]) -> None:
        """The batch task itself was cancelled (only at loop shutdown): nobody is left to run
        the rest, so the callers of ``batch`` and of every queued op are cancelled too."""
        for p in [*batch, *self._queue]:
            p.future.cancel()
        self._queue = []

    def _take_batch(self) -> list[_Pending[Op]]:
        """Take the next batch off the queue: the ops not withdrawn of the oldest one's
        kind, in arrival order; the others stay queued, in order."""
        queue, self._queue = self._queue, []
        kind = self._kind
        batch: list[_Pending[Op]] = []
        first: Hashable = None
        for p in queue:
            if p.future.done():  # withdrawn: its caller was cancelled while queued
                continue
            if kind is not None:
                if not batch:
                    first = kind(p.op)
                elif kind(p.op) != first:
                    self._queue.append(p)
                    continue
            batch.append(p)
        return batch


def _checked(outcomes: Sequence[Outcome], ops: int) -> list[Outcome]:
    """What ``run_batch`` returned for ``ops`` ops, checked to answer every op (the inline
    op and a drained batch alike)."""
    answered = list(outcomes)
    if len(answered) != ops:
        raise RuntimeError(f"run_batch returned {len(answered)} outcomes for {ops} ops")
    return answered


# The former name, for one release (runstore.moved).
__getattr__ = renamed_attribute(__name__)
