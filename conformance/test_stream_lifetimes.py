"""Stream lifetimes and heartbeats, the stream bridge rules on their time boundaries:
a subscription takes its position when it is first iterated, a heartbeat only fills a
silence of one interval, a removed stream frees its run id
(after ``cleanup``, the late-subscriber window, or expiry), and a run that dies without
END expires ``stream_ttl_seconds`` after its last publish, not after its first
(docs/streams.md). Bridges take time from their event loop and their server, so these
tests wait for real, in fractions of a second (``stream_ttl_seconds`` is at least 1).
Assertion messages name the contract that broke.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.streams.protocol import END, HEARTBEAT, StreamBridge, StreamEvent

from .test_streams import QUIET, WAIT, assert_events, drain, new_run, next_item, publish_many


async def _gone(bridge: StreamBridge, run_id: str, contract: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while await bridge.stream_exists(run_id):
        if loop.time() > deadline:
            raise AssertionError(f"contract: {contract} (still there after {WAIT}s)")
        await asyncio.sleep(0.05)


def test_heartbeats_only_fill_a_silence_of_one_interval(streams_target: Any) -> None:
    """Events arrive every ``interval / 6`` for three intervals, then nothing: every
    heartbeat the subscriber gets comes at least one interval after the item before it
    (measured by the subscriber, so a stalled machine gives a longer silence, never a
    false failure), and one comes once the events stop."""

    async def body(bridge: StreamBridge) -> None:
        interval = 0.3
        run_id = new_run()
        await bridge.publish(run_id, "values", {"i": -1})
        sub = bridge.subscribe(run_id, heartbeat_interval=interval)
        loop = asyncio.get_running_loop()
        got: list[tuple[float, float, Any]] = []  # (asked at, arrived at, item)

        async def publisher() -> None:
            for i in range(18):
                await asyncio.sleep(interval / 6)
                await bridge.publish(run_id, "values", {"i": i})

        task = asyncio.ensure_future(publisher())
        try:
            last = loop.time()
            while True:
                item = await asyncio.wait_for(anext(sub), WAIT)
                got.append((last, loop.time(), item))
                last = loop.time()
                if item is HEARTBEAT and task.done():
                    break
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await sub.aclose()
        early = [
            (round(arrived - since, 3), i) for i, (since, arrived, item) in enumerate(got)
            if item is HEARTBEAT and arrived - since < interval * 0.9
        ]
        assert not early, (
            f"contract: a heartbeat only fills a silence of one interval ({interval}s): heartbeats "
            f"came {early} (seconds after the item before, position) while events arrived every "
            f"{interval / 6:.2f}s"
        )
        events = [item for _, _, item in got if isinstance(item, StreamEvent)]
        assert [e.data["i"] for e in events] == list(range(-1, 18)), (
            "contract: a subscriber receives every event in order, heartbeats between them or not"
        )

    streams_target.run(body)


def test_a_removed_stream_frees_its_run_id(streams_target: Any) -> None:
    """After ``cleanup``, and after the late-subscriber window removed an ended stream, the
    same run id publishes again: a new stream (stream_exists, no END of the old one), whose
    subscribers receive only the new events."""

    async def body(bridge: StreamBridge) -> None:
        for how in ("cleanup", "window"):
            run_id = new_run()
            await bridge.publish(run_id, "values", {"old": 1})
            await bridge.publish_end(run_id)
            if how == "cleanup":
                await bridge.cleanup(run_id)
            else:
                await _gone(bridge, run_id, "after END the stream is removed once the window passes")
            contract = (f"a removed stream frees its run id ({how}): the run id publishes again as "
                        "a new stream")
            try:
                fresh = StreamEvent(await bridge.publish(run_id, "values", {"new": 1}), "values", {"new": 1})
            except Exception as exc:
                raise AssertionError(f"contract: {contract} (publish raised {exc!r})") from None
            assert await bridge.stream_exists(run_id), f"contract: {contract} (stream_exists is false)"
            sub = bridge.subscribe(run_id, heartbeat_interval=0.05)
            first = await next_item(sub, contract)
            assert first == fresh, f"contract: {contract}; a new subscriber got {first!r} first"
            await bridge.publish_end(run_id)
            assert await drain(sub, contract) == [END]
            await bridge.cleanup(run_id)

    streams_target.run(body, settings={"stream_bridge": {"late_subscriber_window_seconds": 0.2}})


def test_a_run_without_end_expires_after_stream_ttl_of_silence(streams_target: Any) -> None:
    """``stream_ttl_seconds=1``: publishes 0.4 s apart keep a run's stream (and every event
    of it) past one TTL after its first publish; once the run falls silent without END the
    stream is removed within the suite's wait, its follower receives END, and the run id
    is free again."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        follower = bridge.subscribe(run_id, heartbeat_interval=0.05)
        follower_items = asyncio.ensure_future(drain(follower, "a follower of an expired stream gets END"))
        await asyncio.sleep(0)
        published = []
        for i in range(4):  # at 0, 0.4, 0.8, 1.2 s: the last one past the first's TTL
            if i:
                await asyncio.sleep(0.4)
            published.append(StreamEvent(await bridge.publish(run_id, "values", {"i": i}), "values", {"i": i}))
        assert await bridge.stream_exists(run_id), (
            "contract: stream_ttl_seconds counts from the last publish (a rolling expiry), not the first"
        )
        await _gone(bridge, run_id, "a run that dies without END expires after stream_ttl_seconds of silence")
        try:
            items = await asyncio.wait_for(follower_items, WAIT)
        except TimeoutError:
            raise AssertionError(
                "contract: a follower of a stream that expired receives END (nothing came)"
            ) from None
        assert_events(items, [*published, END], "stream_ttl_seconds counts from the last publish: "
                      "a follower receives every event of a run kept alive by publishes, then END on expiry")
        await bridge.publish(run_id, "values", {"again": 1})
        assert await bridge.stream_exists(run_id), "contract: an expired stream frees its run id"
        await bridge.cleanup(run_id)

    streams_target.run(body, settings={"stream_bridge": {"stream_ttl_seconds": 1}})


def test_a_heartbeat_interval_must_be_positive(streams_target: Any) -> None:
    """``subscribe(heartbeat_interval=x)`` with ``x`` zero, negative or NaN is a ValueError
    (when called or at the first item), never a subscription that spins or never beats."""

    async def body(bridge: StreamBridge) -> None:
        for bad in (0, -1, float("nan")):
            try:
                sub = bridge.subscribe(new_run(), heartbeat_interval=bad)
                await asyncio.wait_for(anext(sub), WAIT)
            except ValueError:
                continue
            except TimeoutError:
                pass
            raise AssertionError(
                f"contract: a heartbeat interval must be > 0 (subscribe(heartbeat_interval={bad!r}) "
                "was accepted)"
            )

    streams_target.run(body)


def test_close_ends_followers_and_is_idempotent(streams_target: Any) -> None:
    """Closing a bridge stops the subscriptions it serves (each ends, with END or without
    another item), and closing it again is harmless."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        await bridge.publish(run_id, "values", {"i": 0})
        follower = bridge.subscribe(run_id, heartbeat_interval=0.05)
        assert isinstance(await next_item(follower, "a subscriber replays the published event"), StreamEvent)
        pending = asyncio.ensure_future(drain(follower, "a follower of a closed bridge stops"))
        await asyncio.sleep(0)
        await bridge.close()
        try:
            rest = await asyncio.wait_for(pending, WAIT)
        except TimeoutError:
            raise AssertionError(
                f"contract: close stops the bridge's subscriptions (a follower still waits after {WAIT}s)"
            ) from None
        except Exception:
            rest = []
        assert all(item is END for item in rest), (
            f"contract: close stops the bridge's subscriptions; a follower got {rest} after close"
        )
        await bridge.close()

    streams_target.run(body)


@pytest.mark.requires("replay")
def test_a_subscription_takes_its_position_when_first_iterated(streams_target: Any) -> None:
    """``subscribe`` only describes a subscription: it starts where the stream is when it
    is first iterated, so events published (and evicted) in between are replayed from
    what is retained then, without a gap (docs/streams.md "Cursors")."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        sub = bridge.subscribe(run_id)
        events = await publish_many(bridge, run_id, 10)  # retained: events[6:]
        await bridge.publish_end(run_id)
        got = await drain(sub, "a subscription made before the publishes replays what is retained")
        assert_events(got, [*events[6:], END], "a subscription takes its position when it is first "
                      "iterated, not when subscribe is called: it replays what is retained then, no gap")

    streams_target.run(body, settings={"stream_bridge": {**QUIET, "queue_maxsize": 4}})
