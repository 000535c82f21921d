"""Cancellation of stream bridge writes at every cancel point (tests/faults/cancel.py).

For each publish path the sweep cancels the call at its k-th suspension for every k,
then checks: everything acknowledged is visible to a fresh subscriber exactly once and
in order, the cancelled publish is there at most once (exactly once if it completed
anyway), ids stay consecutive, and the bridge keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runstore import END, HEARTBEAT, StreamEvent
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

from .cancel import Outcome, cancel_at, every_cancel_point, suspensions
from .servers import RedisServer

pytestmark = pytest.mark.faults

WAIT = 30.0
_runs = itertools.count()


@contextlib.asynccontextmanager
async def redis_bridge(url: str) -> AsyncIterator[Any]:
    from runstore.plugins.redis.streams import RedisStreamBridge

    async with BackendOptions.scope(Settings()) as options:
        bridge = await RedisStreamBridge.open(BackendURL.parse(url), options)
        options.on_close(bridge.close)
        yield bridge


async def replay(bridge: Any, run_id: str) -> dict[str, Any]:
    """What a fresh subscriber sees of a finished run: id -> data of its events (END checked)."""
    items = []
    async for item in bridge.subscribe(run_id):
        if item is not HEARTBEAT:
            items.append(item)
    assert items[-1] is END and all(isinstance(i, StreamEvent) for i in items[:-1]), items
    ids = [int(i.id.split("-")[1]) for i in items[:-1]]
    assert ids == list(range(1, len(ids) + 1)), f"consecutive ids from 0-1: {ids}"
    return {i.id: i.data for i in items[:-1]}


class Sweep:
    """Counts over one sweep: trials, acknowledged publishes, lost, duplicated."""

    def __init__(self) -> None:
        self.trials = self.acknowledged = self.lost = self.duplicated = self.completed = 0

    def check(self, seen: dict[str, Any], acknowledged: dict[str, Any], cancelled: Any, completed: bool) -> None:
        """Each acknowledged id holds its data; ``cancelled`` is there at most once (once if it
        completed); nothing else is."""
        data = list(seen.values())
        self.trials += 1
        self.acknowledged += len(acknowledged)
        self.lost += sum(1 for i, d in acknowledged.items() if seen.get(i) != d)
        self.duplicated += len(data) - len(set(data))
        self.completed += completed
        assert {i: d for i, d in seen.items() if d != cancelled} == {
            i: d for i, d in acknowledged.items() if d != cancelled
        }, (seen, acknowledged)
        assert data.count(cancelled) == (1 if completed else data.count(cancelled)) <= 1, (seen, cancelled)
        if completed:
            assert {i: d for i, d in seen.items() if d == cancelled} == {
                i: d for i, d in acknowledged.items() if d == cancelled
            }, "a cancelled call that completed anyway returned the id its event got"

    def report(self, fault_report: Any, fault: str) -> None:
        fault_report.add(fault, trials=self.trials, acknowledged=self.acknowledged, lost=self.lost,
                         duplicated=self.duplicated, completed_anyway=self.completed)


async def sweep_publish(
    writer: Any, reader: Any, fault_report: Any, fault: str, *, before: Callable[[], Awaitable[Any]] | None = None
) -> Sweep:
    """Cancel ``writer.publish`` at each of its suspensions; ``before`` runs ahead of each trial."""
    result = Sweep()

    async def trial(k: int) -> Outcome[Any]:
        run_id = f"sweep-{next(_runs)}"
        acknowledged = {await writer.publish(run_id, "v", "a"): "a"}
        if before is not None:
            await before()
        outcome = await cancel_at(lambda: writer.publish(run_id, "v", "X"), k)
        assert outcome.error is None or outcome.cancelled, outcome.error
        if not outcome.cancelled:
            acknowledged[outcome.result] = "X"
        acknowledged[await writer.publish(run_id, "v", "b")] = "b"  # the bridge still works
        await writer.publish_end(run_id)
        result.check(await replay(reader, run_id), acknowledged, "X", completed=not outcome.cancelled)
        return outcome

    await every_cancel_point(trial)
    result.report(fault_report, fault)
    return result


async def test_redis_publish_cancelled_at_every_suspension(fault_report: Any) -> None:
    with RedisServer() as server:
        async with redis_bridge(server.url()) as writer, redis_bridge(server.url()) as reader:
            await sweep_publish(writer, reader, fault_report, "redis: publish cancelled (pooled connection)")
            cold = await sweep_publish(
                writer, reader, fault_report, "redis: publish cancelled (connecting)",
                before=writer.calls.pool.disconnect,
            )
            # The checkout is shielded: a caller cancelled while its connection is being set
            # up returns at once, and the half-set-up connection goes back to the pool closed.
            assert cold.trials > cold.completed, "cancelled while connecting"

            async def pause_writes() -> None:
                # The server holds write commands for 100 ms, so the publish is sent and
                # then waits for its reply: the cancel point a local server rarely shows.
                await asyncio.to_thread(server.command, "CLIENT", "PAUSE", 100, "WRITE")

            waiting = await sweep_publish(
                writer, reader, fault_report, "redis: publish cancelled (sent, awaiting the reply)",
                before=pause_writes,
            )
            assert waiting.trials > waiting.completed, "cancelled while its reply was outstanding"


async def test_redis_pipelined_publishes_cancelled_at_every_suspension(fault_report: Any) -> None:
    """Three concurrent publishes (one in flight, two queued behind it): cancel the first,
    then the second, at each of their suspensions; the others are unaffected."""
    with RedisServer() as server:
        async with redis_bridge(server.url()) as writer, redis_bridge(server.url()) as reader:
            result = Sweep()
            for victim in (0, 1):

                async def trial(k: int, victim: int = victim) -> Outcome[Any]:
                    run_id = f"pipe-{next(_runs)}"
                    acknowledged = {await writer.publish(run_id, "v", "a"): "a"}
                    # The server holds writes for 100 ms: p0 waits for its reply, p1 and p2 queue.
                    await asyncio.to_thread(server.command, "CLIENT", "PAUSE", 100, "WRITE")
                    calls = [lambda i=i: writer.publish(run_id, "v", f"p{i}") for i in range(3)]
                    tasks: list[asyncio.Future[Any]] = []
                    for i, call in enumerate(calls):
                        tasks.append(asyncio.ensure_future(cancel_at(call, k) if i == victim else call()))
                        await asyncio.sleep(0)  # p0 goes in flight first, p1 and p2 queue behind it
                    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
                    outcome: Outcome[Any] = done[victim]
                    for i, reply in enumerate(done):
                        if i != victim:
                            assert isinstance(reply, str), done
                            acknowledged[reply] = f"p{i}"
                        elif not outcome.cancelled:
                            acknowledged[outcome.result] = f"p{i}"
                    acknowledged[await writer.publish(run_id, "v", "b")] = "b"
                    await writer.publish_end(run_id)
                    seen = await replay(reader, run_id)
                    result.check(seen, acknowledged, f"p{victim}", completed=not outcome.cancelled)
                    return outcome

                await every_cancel_point(trial)
            result.report(fault_report, "redis: pipelined publish cancelled (in flight or queued)")


async def test_redis_publish_end_cancelled_at_every_suspension(fault_report: Any) -> None:
    with RedisServer() as server:
        async with redis_bridge(server.url()) as writer, redis_bridge(server.url()) as reader:

            async def trial(k: int) -> Outcome[Any]:
                run_id = f"end-{next(_runs)}"
                await writer.publish(run_id, "v", "a")
                outcome = await cancel_at(lambda: writer.publish_end(run_id), k)
                await writer.publish_end(run_id)  # idempotent: one END whatever happened
                assert list((await replay(reader, run_id)).values()) == ["a"]
                return outcome

            total = await every_cancel_point(trial)
            fault_report.add("redis: publish_end cancelled", trials=total, acknowledged=total, lost=0,
                             duplicated=0)


async def test_memory_bridge_writes_have_no_cancel_point(fault_report: Any) -> None:
    """The memory bridge's writes never suspend: a cancellation lands before or after the
    whole call, never inside it."""
    from runstore.plugins.memory.streams import MemoryStreamBridge

    bridge = MemoryStreamBridge(heartbeat_interval=0.05)
    await bridge.publish("m", "v", "a")
    assert await suspensions(lambda: bridge.publish("m", "v", "b")) == 0
    assert await suspensions(lambda: bridge.publish_end("m")) == 0
    assert await suspensions(lambda: bridge.cleanup("m", delay=5)) == 0
    outcome = await cancel_at(lambda: bridge.publish("n", "v", "x"), 1)
    assert not outcome.cancelled and outcome.result == "0-1", "no suspension: nothing to cancel"
    # A caller cancelled before its turn never starts the call at all.
    task = asyncio.ensure_future(bridge.publish("n", "v", "never"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await bridge.publish_end("n")
    assert await replay(bridge, "n") == {"0-1": "x"}
    await bridge.close()
    fault_report.add("memory: publish cancelled", trials=2, acknowledged=1, lost=0, duplicated=0)
