"""The worker loop end to end: a worker process SIGKILLed mid-run on PostgreSQL + Redis is taken
over by another worker once its lease expires; the stream ends, the completion event is
written once, the thread never has two active runs, and the dead worker's token is stale."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.checkpoint.rules import FENCE_KEY
from runstore.errors import StaleFenceError
from runstore.streams.protocol import END
from runstore.worker import COMPLETION_EVENT, WORKER_LOST, Lease, Worker

from .worker_graph import STEPS, build

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("worker_graph.py")


async def _state(saver: Any, thread: str) -> int:
    got = await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    return -1 if got is None else int(got.checkpoint["channel_values"].get("n", -1))


async def _kill_mid_run(stores: Any, pg: str, redis: str, thread: str, ttl: float) -> tuple[str, int]:
    """Start the worker process, wait until it is mid-run, SIGKILL it; (run_id, its token)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), pg, redis, thread, "worker-1", str(ttl),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
        assert line and line[0] == "started", f"worker did not start: {line} {await proc.stderr.read() if proc.stderr else ''}"
        run_id, fence = line[1], int(line[2])
        deadline = time.monotonic() + 60
        while await _state(stores.checkpointer, thread) < 2:
            assert time.monotonic() < deadline, "the worker wrote no checkpoints"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    return run_id, fence


async def test_sigkilled_worker_is_taken_over(postgres_url: str, redis_url: str) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    ttl = 1.5
    async with runstore.open(
        checkpointer=postgres_url, events=postgres_url, runs=postgres_url, streams=redis_url
    ) as stores:
        samples: list[tuple[float, int]] = []
        sampling = True

        async def monitor() -> None:
            while sampling:
                runs = await stores.runs.list_by_thread(thread)
                samples.append((time.monotonic(), sum(r["active"] for r in runs)))
                await asyncio.sleep(0.02)

        watcher = asyncio.ensure_future(monitor())
        run_id, old_fence = await _kill_mid_run(stores, postgres_url, redis_url, thread, ttl)
        killed_at = time.monotonic()
        n_at_kill = await _state(stores.checkpointer, thread)
        assert 2 <= n_at_kill < STEPS, f"the kill did not land mid-run (n={n_at_kill})"

        async def follow() -> list[Any]:
            return [item async for item in stores.streams.subscribe(run_id, heartbeat_interval=0.5)]

        follower = asyncio.ensure_future(follow())
        graph = build(stores.checkpointer)
        rescuer = Worker(
            stores.runs, stores.checkpointer, owner="worker-2", ttl=5, grace=0.2,
            streams=stores.streams, events=stores.events,
        )  # fmt: skip

        # The dead worker's run holds the thread until its lease has expired and grace passed.
        results: list[Any] = []
        deadline = time.monotonic() + 60
        while not results:
            assert time.monotonic() < deadline, "no worker took the orphaned run over"
            results = await rescuer.recover(lambda lease: rescuer.invoke(graph, None, lease))
            if not results:
                await asyncio.sleep(0.1)
        taken_at = time.monotonic()
        sampling = False
        await watcher

        (done,) = results
        assert done.outcome == "finished", done
        run = done.run
        assert (run["run_id"], run["status"], run["owner"]) == (run_id, "success", "worker-2")
        assert run["fence"] == old_fence + 1, "the takeover issued the thread's next token"
        assert await _state(stores.checkpointer, thread) == STEPS, "the rescuer finished the graph"

        items = await asyncio.wait_for(follower, 30)
        assert items and items[-1] is END, f"the run's stream ended (got {items[-3:]})"
        completions = await stores.events.list_events(
            thread, run_id, event_types=[COMPLETION_EVENT], user_id=None
        )
        assert len(completions) == 1 and completions[0]["content"]["status"] == "success"

        # One active run at every moment: the orphan held the thread until it was finished.
        assert max(n for _, n in samples) == 1, "two runs were active on the thread at once"
        orphaned = [n for t, n in samples if killed_at <= t <= taken_at - 0.5]
        assert orphaned and set(orphaned) == {1}, "the orphaned run stayed the thread's active run"

        # The dead worker, were it to come back, can no longer write the thread.
        head = await stores.checkpointer.aget_tuple({"configurable": {"thread_id": thread}})
        assert head is not None
        stale = {"configurable": {**head.config["configurable"], FENCE_KEY: old_fence}}
        with pytest.raises(StaleFenceError):
            await stores.checkpointer.aput_writes(stale, [("n", 99)], "zombie", "")


async def test_recovery_without_work_ends_the_run(postgres_url: str, redis_url: str) -> None:
    """Recovery with nothing to resume finalizes the orphan as an error (worker_lost), ends its
    stream and writes its completion event once, even when recovered twice."""
    thread = f"t-{uuid.uuid4().hex}"
    async with runstore.open(
        checkpointer=postgres_url, events=postgres_url, runs=postgres_url, streams=redis_url
    ) as stores:
        dying = Worker(stores.runs, stores.checkpointer, owner="dying", ttl=0.3)
        lease: Lease = await dying.start(thread)
        await stores.streams.publish(lease.run["run_id"], "updates", {"n": 1})
        await asyncio.sleep(0.6)
        rescuer = Worker(
            stores.runs, stores.checkpointer, owner="rescuer", ttl=5, grace=0.1,
            streams=stores.streams, events=stores.events,
        )  # fmt: skip
        (done,) = await rescuer.recover()
        assert done.run["status"] == "error" and done.run["stop_reason"] == WORKER_LOST
        await rescuer.complete(done.run)  # a repeated completion writes nothing new
        events = await stores.events.list_events(thread, lease.run["run_id"], user_id=None)
        assert [e["event_type"] for e in events] == [COMPLETION_EVENT]
        items = [i async for i in stores.streams.subscribe(lease.run["run_id"])]
        assert items[-1] is END
        assert await rescuer.recover() == [], "a finished run is not claimed again"



def _sqlite(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    return runstore.open(checkpointer=url, runs=url, events=url, streams="memory://")


async def _write_until_stopped(saver: Any, lease: Lease, writes: list[int]) -> None:
    """Pending writes on the thread's head, one every 20 ms, until cancelled or refused."""
    config = lease.config()
    root = {"v": 1, "id": str(uuid.uuid1()), "ts": "2020-01-01T00:00:00+00:00",
            "channel_values": {}, "channel_versions": {}, "versions_seen": {}}  # fmt: skip
    stored = await saver.aput(config, root, {}, {})
    target = {"configurable": {**config["configurable"], **stored["configurable"]}}
    for i in range(10_000):
        await saver.aput_writes(target, [("n", i)], f"task-{i}", "")
        writes.append(i)
        await asyncio.sleep(0.02)


async def test_a_stalled_worker_stops_once_taken_over(tmp_path: Path) -> None:
    """A worker that misses its renewals is taken over; its next write is refused as stale,
    it returns outcome 'lost' and finalizes nothing."""
    async with _sqlite(tmp_path) as stores:
        stalled = Worker(stores.runs, stores.checkpointer, owner="stalled", ttl=0.3, renew_every=60)
        lease = await stalled.start("t1")
        writes: list[int] = []
        running = asyncio.ensure_future(
            stalled.execute(lease, lambda held: _write_until_stopped(stores.checkpointer, held, writes))
        )
        await asyncio.sleep(0.5)
        rescuer = Worker(stores.runs, stores.checkpointer, owner="rescuer", ttl=30, grace=0)
        (taken,) = await rescuer.recover()
        lost = await asyncio.wait_for(running, 10)
        assert lost.outcome == "lost", lost
        assert taken.run["owner"] == "rescuer" and taken.run["status"] == "error"
        assert (await stores.runs.get(lease.run["run_id"]))["owner"] == "rescuer"  # type: ignore[index]
        count = len(writes)
        await asyncio.sleep(0.1)
        assert len(writes) == count, "the stalled worker kept writing after it was taken over"


async def test_cancel_request_stops_the_work(tmp_path: Path) -> None:
    """A cancel request seen at a renewal cancels the work; the run ends as cancelled."""
    async with _sqlite(tmp_path) as stores:
        worker = Worker(
            stores.runs, stores.checkpointer, owner="w", ttl=3, renew_every=0.05,
            streams=stores.streams, events=stores.events,
        )  # fmt: skip
        lease = await worker.start("t1")
        running = asyncio.ensure_future(
            worker.execute(lease, lambda held: _write_until_stopped(stores.checkpointer, held, []))
        )
        await asyncio.sleep(0.2)
        assert await stores.runs.request_cancel(lease.run["run_id"]) == "interrupt"
        done = await asyncio.wait_for(running, 10)
        assert done.outcome == "finished" and done.run["status"] == "cancelled"
        assert done.run["stop_reason"] == "interrupt"
        events = await stores.events.list_events("t1", lease.run["run_id"], user_id=None)
        assert [e["event_type"] for e in events] == [COMPLETION_EVENT]
