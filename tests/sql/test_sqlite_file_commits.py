"""The file's group commit: the sqlite stores on one file write through one queue."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import runstore
from runstore.plugins.sqlite import ops as saver_ops
from runstore.plugins.sqlite.commits import FileCommits
from runstore.urls import BackendURL


def _events(thread: str, n: int) -> list[dict[str, Any]]:
    return [
        {"thread_id": thread, "run_id": "r", "event_type": "e", "category": "message", "content": f"c{i}"}
        for i in range(n)
    ]


def _cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


class _Blocked:
    """Holds the file writer's thread until `release`, counting the batches run meanwhile."""

    def __init__(self, commits: FileCommits) -> None:
        self.commits = commits
        self.gate = threading.Event()
        self.batches: list[int] = []
        writer = commits._writer
        assert writer is not None
        self.busy = asyncio.ensure_future(writer.run(lambda _conn: self.gate.wait(30)))
        real = commits.queue._run_batch

        async def counting(ops: list[Any]) -> Any:
            self.batches.append(len(ops))
            return await real(ops)

        commits.queue._run_batch = counting  # type: ignore[method-assign]

    async def release(self) -> None:
        self.gate.set()
        await self.busy


async def test_saver_and_event_store_writes_commit_in_one_batch(tmp_path: Path) -> None:
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        saver, events = stores.checkpointer, stores.events
        commits = saver._state.file
        assert commits is events._driver._commits, "one queue per file"
        blocked = _Blocked(commits)
        first = asyncio.ensure_future(events.put_batch(_events("t-first", 1), user_id=None))
        await asyncio.sleep(0.05)  # taken into a batch of its own, waiting behind the gate
        checkpoint = empty_checkpoint()
        calls = [
            asyncio.ensure_future(saver.aput(_cfg("t-shared"), checkpoint, {}, {})),
            asyncio.ensure_future(events.put_batch(_events("t-shared", 3), user_id=None)),
            asyncio.ensure_future(events.put_batch(_events("t-other", 2), user_id=None)),
        ]
        await asyncio.sleep(0.05)
        await blocked.release()
        await asyncio.gather(first, *calls)
        assert blocked.batches == [1, 3], "the writes that queued meanwhile share one batch"
        got = await saver.aget_tuple(_cfg("t-shared"))
        assert got is not None and got.checkpoint["id"] == checkpoint["id"]
        shared = await events.list_events("t-shared", "r", user_id=None)
        assert [r["seq"] for r in shared] == [1, 2, 3]
        assert len(await events.list_events("t-other", "r", user_id=None)) == 2


async def test_a_failing_append_fails_alone_in_a_shared_batch(tmp_path: Path) -> None:
    """A stale fence refuses its own append; the saver's write and the other append in the
    same batch commit."""
    from runstore.errors import StaleFenceError

    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        saver, events = stores.checkpointer, stores.events
        await events.put_batch(_events("t-fenced", 1), user_id=None, fence=5)
        # Another thread's batch last: the fenced thread's next append queues (a lone
        # caller right after its own thread's batch would run inline, alone).
        await events.put_batch(_events("t-warm", 1), user_id=None)
        blocked = _Blocked(saver._state.file)
        checkpoint = empty_checkpoint()
        results = [
            asyncio.ensure_future(events.put_batch(_events("t-fenced", 2), user_id=None, fence=3)),
            asyncio.ensure_future(saver.aput(_cfg("t-ok"), checkpoint, {}, {})),
            asyncio.ensure_future(events.put_batch(_events("t-ok", 2), user_id=None)),
        ]
        await asyncio.sleep(0.05)
        await blocked.release()
        outcomes = await asyncio.gather(*results, return_exceptions=True)
        assert blocked.batches == [3]
        assert isinstance(outcomes[0], StaleFenceError)
        assert len(await events.list_events("t-fenced", "r", user_id=None)) == 1
        assert len(await events.list_events("t-ok", "r", user_id=None)) == 2
        assert (await saver.aget_tuple(_cfg("t-ok"))) is not None


async def test_an_append_cancelled_in_its_batch_returns_once_the_batch_ended(tmp_path: Path) -> None:
    """The event store's contract: a cancelled call has settled when it returns. Its append
    was taken into a batch, so it commits with the batch, and the caller's CancelledError
    comes only after that, with the file's write lock free again."""
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        events = stores.events
        commits = events._driver._commits
        blocked = _Blocked(commits)
        call = asyncio.ensure_future(events.put_batch(_events("t-taken", 4), user_id=None))
        await asyncio.sleep(0.05)
        assert not commits.queue._queue, "the append was taken into a batch"
        call.cancel()
        await asyncio.sleep(0.05)
        assert not call.done(), "the cancelled append waits for its batch to end"
        await blocked.release()
        with pytest.raises(asyncio.CancelledError):
            await call
        writer = commits._writer
        assert writer is not None
        assert not await writer.run(lambda conn: conn.in_transaction), "its batch has ended"
        assert len(await events.list_events("t-taken", "r", user_id=None)) == 4


async def test_an_append_cancelled_while_queued_never_runs(tmp_path: Path) -> None:
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        events = stores.events
        blocked = _Blocked(events._driver._commits)
        first = asyncio.ensure_future(events.put_batch(_events("t-first", 1), user_id=None))
        await asyncio.sleep(0.05)  # the first batch waits behind the gate
        queued = asyncio.ensure_future(events.put_batch(_events("t-queued", 2), user_id=None))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued  # returns at once: nothing of it ran
        await blocked.release()
        await first
        assert await events.list_events("t-queued", "r", user_id=None) == []
        assert blocked.batches == [1]


async def test_the_writer_goes_back_to_the_pool_with_its_last_store(tmp_path: Path) -> None:
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        commits = stores.checkpointer._state.file
        assert commits._writer is not None
        await stores.checkpointer.aclose()
        assert commits._writer is not None, "the event store still writes through it"
        await stores.events.put_batch(_events("t-after", 1), user_id=None)
        await stores.events.close()
        assert commits._writer is None


async def test_closing_the_saver_waits_for_its_own_writes_only(tmp_path: Path) -> None:
    """The queue is shared: closing the saver while the event store keeps appending must
    not wait for the queue to go idle (under steady appends it never does)."""
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        saver, events = stores.checkpointer, stores.events
        stop = asyncio.Event()
        appended = [0]

        async def appender(name: str) -> None:
            while not stop.is_set():
                await events.put_batch(_events(name, 1), user_id=None)
                appended[0] += 1

        appenders = [asyncio.ensure_future(appender(f"t-app-{i}")) for i in range(4)]
        await asyncio.sleep(0.05)
        checkpoint = empty_checkpoint()
        saved = await saver.aput(_cfg("t-closing"), checkpoint, {}, {})
        await asyncio.wait_for(saver.aclose(), 10)
        assert not any(a.done() for a in appenders), "the appends went on meanwhile"
        stop.set()
        await asyncio.gather(*appenders)
        assert appended[0] > 0
        assert (await stores.events.list_events("t-app-0", "r", user_id=None))
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        got = await stores.checkpointer.aget_tuple(saved)
        assert got is not None and got.checkpoint["id"] == checkpoint["id"]


def _batch_tasks(commits: FileCommits) -> list[asyncio.Task[Any] | None]:
    """The task each batch of ``commits`` runs in, appended as batches start."""
    ran_in: list[asyncio.Task[Any] | None] = []
    real = commits.queue._run_batch

    async def recording(ops: list[Any]) -> Any:
        ran_in.append(asyncio.current_task())
        return await real(ops)

    commits.queue._run_batch = recording  # type: ignore[method-assign]
    return ran_in


async def test_a_lone_callers_writes_run_in_its_own_task(tmp_path: Path) -> None:
    """A thread written by one caller at a time: after its first batch, each write runs in
    the caller's task (no hop to the batch task and back); another thread's write in
    between sends the next one through the queue again."""
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, streams="memory://") as stores:
        saver = stores.checkpointer
        ran_in = _batch_tasks(saver._state.file)

        async def put(thread: str) -> asyncio.Task[Any] | None:
            await saver.aput(_cfg(thread), empty_checkpoint(), {}, {})
            return asyncio.current_task()

        first = await put("t-alone")
        assert ran_in[-1] is not first, "the first write of the thread goes through the queue"
        for _ in range(3):
            caller = await put("t-alone")
            assert ran_in[-1] is caller, "the same thread's next write runs in its caller's task"
        await put("t-other")
        caller = await put("t-alone")
        assert ran_in[-1] is not caller, "after another thread's batch the write queues again"
        assert len(ran_in) == 6
        got = await saver.aget_tuple(_cfg("t-alone"))
        assert got is not None


async def test_a_lone_callers_appends_run_in_its_own_task(tmp_path: Path) -> None:
    """The event store's appends of one thread, one caller at a time, run in the caller's
    task after the thread's first batch, like the saver's writes; a batch of several
    threads' events never does."""
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(events=url, streams="memory://") as stores:
        events = stores.events
        ran_in = _batch_tasks(events._driver._commits)
        me = asyncio.current_task()
        await events.put_batch(_events("t-alone", 2), user_id=None)
        assert ran_in[-1] is not me, "the thread's first append goes through the queue"
        await events.put_batch(_events("t-alone", 2), user_id=None)
        assert ran_in[-1] is me, "its next append runs in the caller's task"
        await events.put_batch([*_events("t-alone", 1), *_events("t-other", 1)], user_id=None)
        assert ran_in[-1] is not me, "events of two threads: no key, through the queue"
        await events.put_batch(_events("t-alone", 1), user_id=None)
        assert ran_in[-1] is not me, "after a batch without a key the append queues again"
        assert len(await events.list_events("t-alone", "r", user_id=None)) == 6


async def test_reads_use_the_idle_writer_and_never_wait_behind_a_batch(tmp_path: Path) -> None:
    """With no write queued, the saver's and the event store's reads run on the file's
    writer (whose page cache holds what it just wrote); while a batch is queued or running
    they run on the store's own reader and answer without waiting for it."""
    url = BackendURL.for_file("sqlite", tmp_path / "f.db").render()
    async with runstore.open(checkpointer=url, events=url, streams="memory://") as stores:
        saver, events = stores.checkpointer, stores.events
        commits = saver._state.file
        await saver.aput(_cfg("t"), empty_checkpoint(), {}, {})
        await events.put_batch(_events("t", 1), user_id=None)
        assert commits._writer is not None
        writer_thread = await commits._writer.run(lambda _conn: threading.get_ident())
        ran_on: list[int] = []
        real_get = saver_ops.get

        def get(conn: Any, *args: Any) -> Any:
            ran_on.append(threading.get_ident())
            return real_get(conn, *args)

        saver_ops.get = get
        try:
            assert await saver.aget_tuple(_cfg("t")) is not None
            assert ran_on[-1] == writer_thread, "an idle file's writer serves the saver's read"
            events_read_on = await commits.read(events._driver._reader, lambda _c: threading.get_ident())
            assert events_read_on == writer_thread, "and the event store's"

            blocked = _Blocked(commits)
            write = asyncio.ensure_future(events.put_batch(_events("t", 1), user_id=None))
            await asyncio.sleep(0.05)
            assert commits.queue.busy and not write.done()
            got = await asyncio.wait_for(saver.aget_tuple(_cfg("t")), 5)
            assert got is not None
            assert ran_on[-1] != writer_thread, "a read during a batch uses the saver's reader"
            page = await asyncio.wait_for(events.list_events("t", "r", user_id=None), 5)
            assert len(page) == 1, "the event store's read answers while the append waits"
            await blocked.release()
            await write
            assert len(await events.list_events("t", "r", user_id=None)) == 2
        finally:
            saver_ops.get = real_get


async def test_the_run_store_writes_through_the_files_one_writer(tmp_path: Path) -> None:
    """One writer per file: the run store opened next to the saver holds no writer of its
    own (one pooled connection more: its reader), and its writes run in the file's batches."""
    from runstore.options import BackendOptions
    from runstore.plugins.sqlite.runs import SqliteRunStore
    from runstore.plugins.sqlite.saver import SqliteSaver

    url = BackendURL.for_file("sqlite", tmp_path / "f.db")
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        engine = saver.engine
        assert engine is not None
        held = engine.pool.checkedout()  # type: ignore[attr-defined]
        runs = await SqliteRunStore.open(url, options)
        assert engine.pool.checkedout() == held + 1, "the run store took a reader, no writer"  # type: ignore[attr-defined]
        ran_in = _batch_tasks(saver._state.file)
        created = await runs.create("t-runs", run_id="a")
        assert created is not None
        assert len(ran_in) == 1, "the run store's write ran in the file's write queue"
        assert [r["run_id"] for r in await runs.list_by_thread("t-runs")] == ["a"]
