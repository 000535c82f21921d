"""The shared group-commit queue and prefetch store of the SQL savers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.batching import BatchQueue, Outcome
from runstore.checkpoint.prefetch import PrefetchStore


class Backend:
    """A fake "run this batch" callback that records batches and can be held open."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.committed: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, ops: list[str]) -> list[Outcome]:
        self.batches.append(list(ops))
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        outcomes: list[Outcome] = []
        for op in ops:
            if op.startswith("bad"):
                outcomes.append((False, ValueError(op)))
            else:
                self.committed.append(op)
                outcomes.append((True, op.upper()))
        return outcomes


async def test_ops_arriving_during_a_batch_share_the_next_one() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    backend.gate.clear()
    first = asyncio.ensure_future(queue.submit("a"))
    await backend.started.wait()
    rest = [asyncio.ensure_future(queue.submit(op)) for op in ("b", "bad-c", "d")]
    await asyncio.sleep(0)
    backend.gate.set()
    assert await first == "A"
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert results[0] == "B" and results[2] == "D"
    assert isinstance(results[1], ValueError), "a failing op fails only its own caller"
    assert backend.batches == [["a"], ["b", "bad-c", "d"]]
    assert not queue.busy


async def test_with_kinds_a_batch_holds_the_oldest_ops_kind_and_the_rest_wait() -> None:
    batches: list[list[str]] = []
    permits = asyncio.Semaphore(0)  # one release lets one batch finish

    batch_started = asyncio.Event()

    async def run(ops: list[str]) -> list[Outcome]:
        batches.append(list(ops))
        batch_started.set()
        await permits.acquire()
        return [(True, op.upper()) for op in ops]

    async def started(count: int) -> None:
        await batch_started.wait()
        batch_started.clear()
        assert len(batches) == count

    queue: BatchQueue[str] = BatchQueue(run, kind=lambda op: op[0])
    first = asyncio.ensure_future(queue.submit("p1"))
    await started(1)
    queued = [asyncio.ensure_future(queue.submit(op)) for op in ("w1", "p2", "w2", "p3")]
    permits.release()
    await started(2)
    assert batches[-1] == ["w1", "w2"], "the oldest op's kind, every queued op of it"
    # A "w" op arriving while the "w" batch runs waits for the next "w" batch, behind
    # the "p" ops queued before it; a cancelled queued op never runs.
    late = asyncio.ensure_future(queue.submit("w3"))
    cancelled = asyncio.ensure_future(queue.submit("p4"))
    await asyncio.sleep(0)
    cancelled.cancel()
    for _ in range(3):
        permits.release()
    assert await first == "P1"
    assert await asyncio.gather(*queued, late) == ["W1", "P2", "W2", "P3", "W3"]
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert batches == [["p1"], ["w1", "w2"], ["p2", "p3"], ["w3"]]
    assert not queue.busy


async def test_a_failing_callback_fails_every_op_of_its_batch() -> None:
    async def broken(ops: list[str]) -> list[Outcome]:
        raise ConnectionError("lost")

    queue: BatchQueue[str] = BatchQueue(broken)
    results = await asyncio.gather(queue.submit("a"), queue.submit("b"), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_a_caller_cancelled_while_queued_withdraws_its_op() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    backend.gate.clear()
    running = asyncio.ensure_future(queue.submit("a"))
    await backend.started.wait()
    queued = asyncio.ensure_future(queue.submit("withdrawn"))
    kept = asyncio.ensure_future(queue.submit("kept"))
    await asyncio.sleep(0)
    queued.cancel()
    backend.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await running == "A" and await kept == "KEPT"
    assert backend.committed == ["a", "kept"], "a withdrawn op never runs"


async def test_a_caller_cancelled_while_its_batch_runs_never_cancels_the_batch() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    backend.gate.clear()
    mine = asyncio.ensure_future(queue.submit("mine"))
    other = asyncio.ensure_future(queue.submit("other"))
    await backend.started.wait()
    mine.cancel()
    await asyncio.sleep(0)
    backend.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await mine
    assert await other == "OTHER"
    await queue.wait_idle()
    assert not backend.cancelled, "the batch ran to its end"
    assert backend.committed == ["mine", "other"], "the cancelled caller's op committed whole"


async def test_a_posted_op_runs_in_order_with_submitted_ones_and_may_be_withdrawn() -> None:
    """`post` queues without waiting (the Redis bridge's pokes): its future holds the
    outcome; cancelling the future while the op is queued withdraws the op."""
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    backend.gate.clear()
    first = asyncio.ensure_future(queue.submit("a"))
    await backend.started.wait()
    posted = queue.post("b")
    withdrawn = queue.post("c")
    later = asyncio.ensure_future(queue.submit("d"))
    await asyncio.sleep(0)
    withdrawn.cancel()
    backend.gate.set()
    assert await first == "A" and await posted == "B" and await later == "D"
    assert backend.batches == [["a"], ["b", "d"]]
    failed = queue.post("bad-e")
    await queue.wait_idle()
    assert isinstance(failed.exception(), ValueError)


async def test_wait_idle_waits_for_queued_batches() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    backend.gate.clear()
    tasks = [asyncio.ensure_future(queue.submit(op)) for op in ("a", "b")]
    await backend.started.wait()
    waiter = asyncio.ensure_future(queue.wait_idle())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    backend.gate.set()
    await waiter
    assert [t.result() for t in tasks] == ["A", "B"]


async def test_a_wrong_outcome_count_is_an_error_for_every_op() -> None:
    async def short(ops: list[Any]) -> list[Outcome]:
        return []

    queue: BatchQueue[str] = BatchQueue(short)
    with pytest.raises(RuntimeError, match="outcomes"):
        await queue.submit("a")


@pytest.mark.parametrize("settle", [False, True])
async def test_a_caller_cancelled_in_its_batch_waits_for_it_only_when_asked(settle: bool) -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run, settle_on_cancel=settle)
    backend.gate.clear()
    caller = asyncio.ensure_future(queue.submit("a"))
    await backend.started.wait()
    caller.cancel()
    await asyncio.sleep(0.01)
    assert caller.done() is not settle, "settle_on_cancel: back only when the batch has ended"
    backend.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await queue.wait_idle()
    assert backend.committed == ["a"], "taken into a batch: committed with it"
    # Withdrawn while queued: back at once either way, never run.
    backend.gate.clear()
    blocker = asyncio.ensure_future(queue.submit("b"))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(queue.submit("c"))
    await asyncio.sleep(0)
    queued.cancel()
    await asyncio.sleep(0)
    assert queued.done()
    backend.gate.set()
    assert await blocker == "B"
    await queue.wait_idle()
    assert "c" not in backend.committed


def _thread(op: str) -> str:
    """The key of a test op: its text up to the first dash ("t1-a" is thread t1's)."""
    return op.split("-")[0]


async def test_a_callers_next_op_on_an_idle_queue_runs_in_its_task() -> None:
    tasks: list[asyncio.Task[Any] | None] = []
    backend = Backend()

    async def run(ops: list[str]) -> list[Outcome]:
        tasks.append(asyncio.current_task())
        return await backend.run(ops)

    queue: BatchQueue[str] = BatchQueue(run, inline_key=_thread)
    me = asyncio.current_task()
    assert await queue.submit("t1-a") == "T1-A"
    assert tasks[-1] is not me, "no batch yet: through the batch task"
    assert await queue.submit("t1-b") == "T1-B"
    assert tasks[-1] is me, "the last batch was this thread's alone: run inline"
    assert not queue.busy
    assert await queue.submit("t2-a") == "T2-A"
    assert tasks[-1] is not me, "another key than the last batch's: through the queue"
    # Ops that arrive while an inline op runs queue and share the next batch.
    backend.gate.clear()
    backend.started.clear()
    first = asyncio.ensure_future(queue.submit("t2-b"))
    await backend.started.wait()
    assert queue.busy and tasks[-1] is first
    later = [asyncio.ensure_future(queue.submit(op)) for op in ("t2-c", "bad-x")]
    await asyncio.sleep(0)
    backend.gate.set()
    assert await first == "T2-B"
    assert await later[0] == "T2-C"
    with pytest.raises(ValueError, match="bad-x"):
        await later[1]
    assert backend.batches[-2:] == [["t2-b"], ["t2-c", "bad-x"]]
    await queue.wait_idle()
    # The last batch held two keys: even that thread's next op queues.
    assert await queue.submit("t2-d") == "T2-D"
    assert tasks[-1] is not me


async def test_concurrent_callers_on_an_idle_queue_share_one_batch() -> None:
    """A burst of callers: none of them runs alone, even the first one's thread."""
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run, inline_key=_thread)
    await queue.submit("t1-a")
    await asyncio.gather(*(queue.submit(f"t{n}-b") for n in range(1, 5)))
    assert backend.batches == [["t1-a"], ["t1-b"], ["t2-b", "t3-b", "t4-b"]], (
        "t1's op ran inline (the queue was idle after its own batch), the rest queued"
    )
    await asyncio.gather(*(queue.submit(f"t{n}-c") for n in range(1, 5)))
    assert backend.batches[-1] == ["t1-c", "t2-c", "t3-c", "t4-c"], "after a mixed batch: one batch"


async def _inline_op_held(backend: Backend) -> tuple[BatchQueue[str], asyncio.Future[Any]]:
    """A queue whose op "t1-b" runs inline, held inside its batch callback."""
    queue: BatchQueue[str] = BatchQueue(backend.run, inline_key=_thread)
    await queue.submit("t1-a")
    backend.gate.clear()
    backend.started.clear()
    alone = asyncio.ensure_future(queue.submit("t1-b"))
    await backend.started.wait()
    return queue, alone


async def test_an_inline_op_cancelled_still_lets_the_queued_ops_run() -> None:
    backend = Backend()
    queue, alone = await _inline_op_held(backend)
    queued = asyncio.ensure_future(queue.submit("t1-c"))
    await asyncio.sleep(0)
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    assert backend.cancelled, "run in its caller's task, the lone op's batch is interrupted"
    assert "t1-b" not in backend.committed
    backend.gate.set()
    assert await queued == "T1-C", "the op queued behind it runs in the next batch"
    await queue.wait_idle()
    assert backend.batches == [["t1-a"], ["t1-b"], ["t1-c"]]


async def test_wait_idle_waits_for_an_inline_op() -> None:
    backend = Backend()
    queue, alone = await _inline_op_held(backend)
    idle = asyncio.ensure_future(queue.wait_idle())
    await asyncio.sleep(0.01)
    assert not idle.done()
    backend.gate.set()
    await idle
    assert alone.done() and backend.committed == ["t1-a", "t1-b"]


@pytest.mark.parametrize("gather", [False, True])
async def test_gather_ready_lets_an_op_prepared_in_the_same_pass_join_the_batch(gather: bool) -> None:
    """An op submitted by a task that became ready just after the batch task was started
    joins that batch with ``gather_ready``; without it, it waits for the next batch."""
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run, gather_ready=gather)
    first = asyncio.ensure_future(queue.submit("a"))
    await asyncio.sleep(0)  # "a" is queued and the batch task is started
    assert queue.busy and not backend.batches
    second = asyncio.ensure_future(queue.submit("b"))  # ready after the batch task
    assert await asyncio.gather(first, second) == ["A", "B"]
    assert backend.batches == ([["a", "b"]] if gather else [["a"], ["b"]])


async def test_a_batch_task_cancelled_while_gathering_cancels_the_queued_callers() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run, gather_ready=True)
    caller = asyncio.ensure_future(queue.submit("a"))
    await asyncio.sleep(0)  # "a" is queued and the batch task is created
    await asyncio.sleep(0)  # the batch task runs up to its gathering pass
    drainer = queue._drainer
    assert drainer is not None and not backend.batches
    drainer.cancel()  # as at loop shutdown, before the batch was taken
    with pytest.raises(asyncio.CancelledError):
        await caller
    with pytest.raises(asyncio.CancelledError):
        await drainer
    assert backend.batches == [] and not queue.busy


async def test_a_batch_task_cancelled_before_it_ran_cancels_the_queued_callers() -> None:
    backend = Backend()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    caller = asyncio.ensure_future(queue.submit("a"))
    await asyncio.sleep(0)  # "a" is queued and the batch task is created, not yet run
    drainer = queue._drainer
    assert drainer is not None
    drainer.cancel()  # as at loop shutdown: the task never takes a step
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(caller, 5)
    assert backend.batches == [] and not queue.busy
    assert await queue.submit("b") == "B", "the next op starts a new batch task"


async def test_a_cancelled_batch_task_never_cancels_the_ops_of_the_next_one() -> None:
    backend = Backend()
    backend.gate.clear()
    queue: BatchQueue[str] = BatchQueue(backend.run)
    first = asyncio.ensure_future(queue.submit("a"))
    await backend.started.wait()
    old = queue._drainer
    assert old is not None
    old.cancel()  # as at loop shutdown, while its batch runs
    with pytest.raises(asyncio.CancelledError):
        await first
    backend.started.clear()
    second = asyncio.ensure_future(queue.submit("b"))
    await backend.started.wait()  # a new task runs "b"'s batch
    third = asyncio.ensure_future(queue.submit("c"))
    await asyncio.sleep(0)  # "c" is queued behind it
    # The old task's done callback may run this late: it must leave the new queue alone.
    queue._drainer_done(old)
    backend.gate.set()
    assert await asyncio.gather(second, third) == ["B", "C"]


def test_prefetched_rows_are_used_once_and_only_without_a_write_since() -> None:
    store = PrefetchStore()
    key = ("t", "", "c1")
    store.store(key, store.generation, ["a", "b"], ["rows"])
    assert store.take(key, ["a"]) == ["rows"]
    assert store.take(key, ["a"]) is None, "used once"
    read_at = store.generation
    with store.writing():
        store.store(key, read_at, ["a"], ["stale"])
    assert store.take(key, ["a"]) is None, "a write overlapped the read"
    store.store(key, store.generation, ["a"], ["rows"])
    assert store.take(key, ["a", "z"]) is None, "rows must cover every channel asked for"


def test_prefetch_store_keeps_the_newest_entries() -> None:
    store = PrefetchStore()
    for i in range(PrefetchStore.MAX_ENTRIES + 5):
        store.store(("t", "", str(i)), 0, ["a"], i)
    assert len(store) == PrefetchStore.MAX_ENTRIES
    assert store.take(("t", "", "0"), ["a"]) is None
    assert store.take(("t", "", str(PrefetchStore.MAX_ENTRIES + 4)), ["a"]) is not None


def test_prefetched_rows_survive_writes_of_other_threads_only() -> None:
    store = PrefetchStore()
    key = ("t", "", "c1")
    read_at = store.generation
    with store.writing("other"):
        pass
    store.store(key, read_at, ["a"], ["rows"])
    assert store.take(key, ["a"]) == ["rows"], "another thread's write cannot change t's history"
    for writer in ("t", None):
        read_at = store.generation
        with store.writing(writer):
            store.store(key, read_at, ["a"], ["stale"])
        assert store.take(key, ["a"]) is None, f"a write of {writer or 'every thread'} overlapped"


def test_prefetch_store_forgetting_threads_counts_as_a_write_of_every_thread() -> None:
    store = PrefetchStore()
    key = ("t", "", "c1")
    read_at = store.generation
    for i in range(PrefetchStore.MAX_THREADS + 1):
        with store.writing(f"other-{i}"):
            pass
    store.store(key, read_at, ["a"], ["rows"])
    assert store.take(key, ["a"]) is None, "forgotten writes are assumed to touch t"
    read_at = store.generation
    store.store(key, read_at, ["a"], ["rows"])
    assert store.take(key, ["a"]) == ["rows"]
