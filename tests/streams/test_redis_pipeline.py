"""The Redis bridge's shared pipeline: calls of many runs share round trips, and each run's
followers, here and in another process's bridge, still see every event once, in order.

Round trips are counted at `RedisCalls.run` (one call, one round trip).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from runstore import END, HEARTBEAT, StreamEvent
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

pytestmark = pytest.mark.redis

WAIT = 30.0
_runs = itertools.count()


class Counted:
    """Wraps a bridge's `RedisCalls.run` to record each round trip's command names."""

    def __init__(self, bridge: Any) -> None:
        self.trips: list[list[str]] = []
        run = bridge.calls.run

        async def counted(operation: str, commands: Any, **kwargs: Any) -> Any:
            if not any(c[0] == "XREAD" for c in commands):  # the reader's blocking reads
                self.trips.append([str(c[0]) for c in commands])
            return await run(operation, commands, **kwargs)

        bridge.calls.run = counted


def _settings() -> Settings:
    return Settings().merged({"stream_bridge": {"heartbeat_interval_seconds": 30, "queue_maxsize": 500}})


@pytest.fixture
async def bridges(redis_url: str) -> AsyncIterator[tuple[Any, Any]]:
    """Two bridges on one server: the publisher's own and another process's."""
    from runstore.plugins.redis.streams import RedisStreamBridge

    async with BackendOptions.scope(_settings()) as options:
        url = BackendURL.parse(redis_url)
        here = await RedisStreamBridge.open(url, options)
        options.on_close(here.close)
        there = await RedisStreamBridge.open(url, options)
        options.on_close(there.close)
        yield here, there


async def _follow(bridge: Any, run_id: str, **kwargs: Any) -> list[Any]:
    items = []
    async for item in bridge.subscribe(run_id, **kwargs):
        if item is not HEARTBEAT:
            items.append(item)
    return items


async def test_calls_of_many_runs_issued_together_share_one_round_trip(bridges: tuple[Any, Any]) -> None:
    here, _ = bridges
    tag = uuid.uuid4().hex[:8]
    runs = [f"{tag}-{i}" for i in range(40)]
    counted = Counted(here)
    ids = await asyncio.gather(*(here.publish(run, "v", i) for i, run in enumerate(runs)))
    assert ids == ["0-1"] * 40
    assert counted.trips == [["EVALSHA"] * 40], "one pipeline for the publishes of 40 runs"
    counted.trips.clear()
    await asyncio.gather(*(here.publish_end(run) for run in runs), *(here.cleanup(run) for run in runs))
    assert counted.trips == [["EVALSHA"] * 40 + ["DEL"] * 40], "END and cleanup of 40 runs in one pipeline, in call order"
    assert not any(await asyncio.gather(*(here.stream_exists(run) for run in runs)))


async def test_a_waker_is_poked_once_however_many_streams_join_meanwhile(bridges: tuple[Any, Any]) -> None:
    here, there = bridges
    tag = uuid.uuid4().hex[:8]
    first = here.subscribe(f"{tag}-first")
    pending = asyncio.ensure_future(anext(first))
    for _ in range(1000):  # until the reader is blocked in an XREAD
        if here._blocked.get(None):
            break
        await asyncio.sleep(0.01)
    counted = Counted(here)
    subs = [here.subscribe(f"{tag}-{i}") for i in range(10)]
    nexts = [asyncio.ensure_future(anext(sub)) for sub in subs]
    await asyncio.sleep(0.2)
    pokes = [trip for trip in counted.trips if "XADD" in trip]
    assert len(pokes) == 1 and pokes[0].count("XADD") == 1, counted.trips
    # Every new stream is in the reader's next XREAD: another process's publish reaches it.
    await asyncio.gather(*(there.publish(f"{tag}-{i}", "v", i) for i in range(10)))
    got = await asyncio.wait_for(asyncio.gather(*nexts), WAIT)
    assert got == [StreamEvent("0-1", "v", i) for i in range(10)]
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    for sub in [first, *subs]:
        await sub.aclose()


async def test_a_follower_here_gets_a_publish_whose_caller_was_cancelled_after_sending(
    bridges: tuple[Any, Any],
) -> None:
    """The event is in the stream (the publish script is atomic), so every follower gets it
    exactly once, in its place, though its caller only saw the cancellation."""
    here, there = bridges
    run = f"cancel-{uuid.uuid4().hex[:8]}"
    await here.publish(run, "v", 0)
    followers = [asyncio.ensure_future(_follow(b, run)) for b in (here, there)]
    for _ in range(1000):  # until the followers' own calls are done: the pipeline is idle
        await asyncio.sleep(0.01)
        if not here._pipeline.busy:
            break
    sending = asyncio.ensure_future(here.publish(run, "v", 1))
    await asyncio.sleep(0)  # the publish is queued and the sender task started
    await asyncio.sleep(0)  # the sender task has taken the batch: the publish is out
    sent = not any(queued.op.publish for queued in here._pipeline._queue)
    assert sent, "the test needs the publish sent before it is cancelled"
    sending.cancel()
    queued = asyncio.ensure_future(here.publish(run, "v", 2))
    await asyncio.sleep(0)
    queued.cancel()  # still queued behind the in-flight pipeline: never sent
    assert await here.publish(run, "v", 3) == "0-3"
    await here.publish_end(run)
    for got in await asyncio.wait_for(asyncio.gather(*followers), WAIT):
        data = [item.data for item in got[:-1]]
        assert got[-1] is END and data == [0, 1, 3], got
        assert [item.id for item in got[:-1]] == [f"0-{n}" for n in range(1, len(data) + 1)]


schedules = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 3)),  # (publisher, pause in loop turns)
    min_size=0, max_size=60,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(schedule=schedules, late=st.sets(st.integers(0, 6)), ends=st.sets(st.integers(0, 6)))
async def test_concurrent_publishers_to_many_runs_deliver_every_event_in_order(
    bridges: tuple[Any, Any], schedule: list[tuple[int, int]], late: set[int], ends: set[int]
) -> None:
    """Seven runs published concurrently in a drawn interleaving: every follower (in the
    publishing bridge, in another, joining before or after the events) gets each run's
    events exactly once, in publish order, with ids 0-1, 0-2, ... and END last."""
    here, there = bridges
    runs = [f"prop-{next(_runs)}-{uuid.uuid4().hex[:6]}" for _ in range(7)]
    plan: dict[int, list[int]] = {}
    for publisher, pause in schedule:
        plan.setdefault(publisher, []).append(pause)
    note(f"plan {plan}, late {late}")
    early = {
        (run, name): asyncio.ensure_future(_follow(bridge, run))
        for n, run in enumerate(runs) if n not in late
        for name, bridge in (("here", here), ("there", there))
    }
    await asyncio.sleep(0.05)

    async def publisher(n: int) -> list[str]:
        ids = []
        for k, pause in enumerate(plan.get(n, [])):
            ids.append(await here.publish(runs[n], "v", [n, k]))
            for _ in range(pause):
                await asyncio.sleep(0)
        await here.publish_end(runs[n])
        if n in ends:
            await here.publish_end(runs[n])  # idempotent
        return ids

    published = await asyncio.wait_for(asyncio.gather(*(publisher(n) for n in range(7))), WAIT)
    followers = dict(early)
    for n in late:
        for name, bridge in (("here", here), ("there", there)):
            followers[(runs[n], name)] = asyncio.ensure_future(_follow(bridge, runs[n]))
    results = await asyncio.wait_for(asyncio.gather(*followers.values()), WAIT)
    for (run, name), got in zip(followers, results, strict=True):
        n = runs.index(run)
        expected = [StreamEvent(f"0-{k + 1}", "v", [n, k]) for k in range(len(plan.get(n, [])))]
        assert published[n] == [e.id for e in expected]
        assert got == [*expected, END], (name, run)
    await asyncio.gather(*(here.cleanup(run) for run in runs))
