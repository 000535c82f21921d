"""Conformance suite, stream part: what every `runstore.StreamBridge` must do.

Each test names the contract it checks (see ``docs/streams.md``). Tests never assert
timing thresholds: heartbeats are checked for occurrence and order with short
intervals, and every wait has a generous upper bound that only a broken bridge hits.

Why one module of this size: pytest collects a suite per module, and one module per
kind is what ``-k test_streams``, `runstore check` and the broken-backend runner select.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runstore.errors import InvalidStreamInputError, StreamEndedError
from runstore.streams.protocol import (
    END,
    HEARTBEAT,
    StreamBridge,
    StreamEvent,
    StreamGap,
    StreamItem,
    format_event_id,
    parse_event_id,
)

from .processes import plugins_env
from .session import development_plugins

#: Upper bound for anything that should arrive; only a broken bridge waits this long.
WAIT = float(os.environ.get("RUNSTORE_CONFORMANCE_WAIT", "10"))
#: Bridge default long enough that no heartbeat shows up unless a test asks for it.
QUIET = {"heartbeat_interval_seconds": 30}


def _settings(**stream_bridge: Any) -> dict[str, Any]:
    return {"stream_bridge": {**QUIET, **stream_bridge}}


def new_run() -> str:
    """A run id no other test (or Hypothesis example) uses."""
    return f"run-{uuid.uuid4().hex}"


async def next_item(sub: AsyncIterator[StreamItem], contract: str, *, heartbeats: bool = False) -> StreamItem:
    """The next item (skipping heartbeats unless asked) within `WAIT` seconds in total, else
    a failure naming ``contract``: heartbeats do not restart the wait."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    skipped = 0
    while True:
        try:
            item = await asyncio.wait_for(anext(sub), max(deadline - loop.time(), 0))
        except TimeoutError:
            got = f"only {skipped} heartbeats arrived" if skipped else "nothing arrived"
            raise AssertionError(f"contract: {contract} ({got} within {WAIT}s)") from None
        except StopAsyncIteration:
            raise AssertionError(f"contract: {contract} (the subscription ended early)") from None
        if heartbeats or item is not HEARTBEAT:
            return item
        skipped += 1


async def drain(sub: AsyncIterator[StreamItem], contract: str) -> list[StreamItem]:
    """Items up to and including END or a gap (heartbeats dropped); checks the iterator then ends."""
    items: list[StreamItem] = []
    while True:
        item = await next_item(sub, contract)
        items.append(item)
        if item is END or isinstance(item, StreamGap):
            break
    await assert_ended(sub, f"{contract}; the subscription ends after END or a gap")
    return items


async def assert_ended(sub: AsyncIterator[StreamItem], contract: str) -> None:
    try:
        extra = await asyncio.wait_for(anext(sub), WAIT)
    except StopAsyncIteration:
        return
    except TimeoutError:
        raise AssertionError(f"contract: {contract} (it kept waiting)") from None
    raise AssertionError(f"contract: {contract} (got {extra!r} after the end)")


async def publish_many(bridge: StreamBridge, run_id: str, count: int, start: int = 0) -> list[StreamEvent]:
    events = []
    for i in range(start, start + count):
        data = {"i": i, "text": f"event {i}"}
        event_id = await bridge.publish(run_id, "values", data)
        events.append(StreamEvent(event_id, "values", data))
    return events


def assert_events(got: Sequence[StreamItem], expected: Sequence[StreamItem], contract: str) -> None:
    assert list(got) == list(expected), (
        f"contract: {contract}\n  expected ids {[_show(i) for i in expected]}\n"
        f"  got          {[_show(i) for i in got]}"
    )


def _show(item: StreamItem) -> str:
    return item.id if isinstance(item, StreamEvent) else repr(item)


# -- declared facts -----------------------------------------------------------------


def test_declared_cross_process_matches_attribute(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        assert bridge.supports_cross_process == streams_target.has("cross_process"), (
            "contract: supports_cross_process matches the declared cross_process capability"
        )
        assert bridge.heartbeat_interval == 0.25, (
            "contract: the bridge holds its default heartbeat from "
            "stream_bridge.heartbeat_interval_seconds"
        )

    streams_target.run(body, settings={"stream_bridge": {"heartbeat_interval_seconds": 0.25}})


# -- ordering and ids ---------------------------------------------------------------


def test_ids_increase_and_events_arrive_in_publish_order(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_a, run_b = new_run(), new_run()
        sub = bridge.subscribe(run_a)
        first = asyncio.ensure_future(next_item(sub, "a live subscriber receives published events"))
        expected: list[StreamEvent] = []
        for i in range(12):
            expected += await publish_many(bridge, run_a, 1, start=i)
            await publish_many(bridge, run_b, 1, start=100 + i)
        await bridge.publish_end(run_a)
        keys = [parse_event_id(e.id) for e in expected]
        assert None not in keys, f"contract: ids are stream ids '<int>-<int>'; got {[e.id for e in expected]}"
        assert keys == sorted(keys) and len(set(keys)) == len(keys), (  # type: ignore[type-var]
            f"contract: ids strictly increase in publish order; got {[e.id for e in expected]}"
        )
        got = [await first, *await drain(sub, "events arrive in publish order, then END")]
        assert_events(got, [*expected, END], "events arrive in publish order with the published ids, "
                      "only the run's own events, then END")

    streams_target.run(body)


def test_many_concurrent_subscribers_each_see_everything(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        subs = [bridge.subscribe(run_id) for _ in range(25)]
        readers = [
            asyncio.ensure_future(drain(s, "every concurrent subscriber receives every event"))
            for s in subs
        ]
        expected: list[StreamItem] = []
        for i in range(40):
            expected += await publish_many(bridge, run_id, 1, start=i)
            if i % 10 == 0:
                await asyncio.sleep(0)
        await bridge.publish_end(run_id)
        results = await asyncio.gather(*readers)
        for n, got in enumerate(results):
            assert_events(got, [*expected, END], f"subscriber {n} of 25 concurrent ones receives "
                          "every event in publish order, then END")

    streams_target.run(body)


# -- replay and cursors -------------------------------------------------------------


@pytest.mark.requires("replay")
def test_replay_from_every_cursor_position(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 8)
        # Live run: a cursor resumes right after itself, then follows new events.
        for i, cursor in enumerate([None, *(e.id for e in events)]):
            sub = bridge.subscribe(run_id, last_event_id=cursor)
            want = events if cursor is None else events[i:]
            got = [await next_item(sub, "a cursor resumes right after itself") for _ in want]
            assert_events(got, list(want), f"cursor {cursor!r} resumes right after itself "
                          "(no cursor replays everything retained)")
            await sub.aclose()
        await bridge.publish_end(run_id)
        # Finished run: the same, ending with END.
        for i, cursor in enumerate([None, *(e.id for e in events)]):
            want = events if cursor is None else events[i:]
            got = await drain(bridge.subscribe(run_id, last_event_id=cursor), "replay, then END")
            assert_events(got, [*want, END], f"cursor {cursor!r} on a finished run replays the "
                          "rest, then END")

    streams_target.run(body)


@pytest.mark.requires("replay")
def test_subscriber_without_cursor_replays_then_follows_live(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        early = await publish_many(bridge, run_id, 3)
        sub = bridge.subscribe(run_id)
        got = [await next_item(sub, "no cursor replays everything retained") for _ in early]
        late = await publish_many(bridge, run_id, 3, start=3)
        got += [await next_item(sub, "after the replay the subscription follows live") for _ in late]
        await bridge.publish_end(run_id)
        got += await drain(sub, "END follows the live events")
        assert_events(got, [*early, *late, END], "no cursor replays everything retained, then "
                      "follows live")

    streams_target.run(body)


@pytest.mark.requires("replay")
def test_cursor_older_than_window_yields_one_gap_and_ends(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 10)  # retained: events[6:]
        for stale in events[:5]:
            got = await drain(bridge.subscribe(run_id, last_event_id=stale.id),
                              "a cursor older than the window yields a StreamGap")
            assert got == [StreamGap(stale.id, events[6].id, events[9].id)], (
                "contract: a cursor older than the retained window yields exactly one StreamGap "
                "(requested, earliest and latest available ids), never a silent skip, then the "
                f"subscription ends; got {got}"
            )
        # The cursor of the last evicted event lost nothing: it resumes without a gap.
        sub = bridge.subscribe(run_id, last_event_id=events[5].id)
        got = [await next_item(sub, "a cursor right before the window resumes") for _ in range(4)]
        assert_events(got, events[6:], "a cursor whose successor is still retained resumes "
                      "without a gap")
        await sub.aclose()
        # The run goes on after a gap; END is not an available event id.
        more = await publish_many(bridge, run_id, 1, start=10)
        await bridge.publish_end(run_id)
        got = await drain(bridge.subscribe(run_id, last_event_id=events[0].id), "gap after END")
        assert got == [StreamGap(events[0].id, events[7].id, more[0].id)], (
            f"contract: the gap names the earliest and latest retained event ids; got {got}"
        )

    streams_target.run(body, settings=_settings(queue_maxsize=4))


@pytest.mark.requires("replay")
def test_slow_subscriber_that_falls_behind_gets_gap(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        sub = bridge.subscribe(run_id)
        (first,) = await publish_many(bridge, run_id, 1)
        assert await next_item(sub, "live follow") == first
        events = await publish_many(bridge, run_id, 9, start=1)  # retained: events[-4:]
        got = await drain(sub, "a slow subscriber that falls behind the window gets a StreamGap")
        assert got == [StreamGap(first.id, events[5].id, events[8].id)], (
            "contract: a slow subscriber that falls behind the window gets a StreamGap, never a "
            f"silent skip; got {[_show(g) for g in got]}"
        )

    streams_target.run(body, settings=_settings(queue_maxsize=4))


#: Where a subscription starts is only visible once it yields something: these tests
#: wait for a HEARTBEAT to prove it started, so a bridge that never heartbeats fails
#: them naming the heartbeat contract, not the cursor rule.
ANCHOR = "an idle subscription yields HEARTBEAT at its interval (used here to see where it started)"

MALFORMED_CURSORS = ["-1", "abc", "", "0-x", "1-2-3", "-", " 1x"]


def test_malformed_cursor_starts_at_live_tail(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        for cursor in MALFORMED_CURSORS:
            run_id = new_run()
            await publish_many(bridge, run_id, 3)
            sub = bridge.subscribe(run_id, last_event_id=cursor, heartbeat_interval=0.05)
            first = await next_item(sub, ANCHOR, heartbeats=True)
            assert first is HEARTBEAT, (
                f"contract: a malformed cursor ({cursor!r}) starts at the live tail: no replay; got {first!r}"
            )
            (new,) = await publish_many(bridge, run_id, 1, start=3)
            got = await next_item(sub, "a malformed-cursor subscription follows live")
            assert got == new, f"contract: a malformed cursor ({cursor!r}) follows new events; got {got!r}"
            await bridge.publish_end(run_id)
            assert await drain(sub, "END after the live tail") == [END]
            # On a finished run the live tail is END.
            got_end = await drain(bridge.subscribe(run_id, last_event_id=cursor), "END for a finished run")
            assert got_end == [END], (
                f"contract: a malformed cursor ({cursor!r}) on a finished run replays END only; got {got_end}"
            )

    streams_target.run(body)


def test_cursor_newer_than_newest_event_starts_at_live_tail(streams_target: Any) -> None:
    """A well-formed Last-Event-ID the stream never handed out (another run's id, or one
    from the future) is not trusted: resuming "after" it would silently skip every event
    published up to that id."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 2)
        newest = parse_event_id(events[-1].id)
        assert newest is not None
        ahead = format_event_id((newest[0], newest[1] + 3))
        sub = bridge.subscribe(run_id, last_event_id=ahead, heartbeat_interval=0.05)
        first = await next_item(sub, ANCHOR, heartbeats=True)
        assert first is HEARTBEAT, (
            f"contract: a cursor newer than the newest event ({ahead!r}, newest {events[-1].id!r}) "
            f"starts at the live tail: no replay; got {first!r}"
        )
        later = await publish_many(bridge, run_id, 5, start=2)
        contract = (f"a cursor newer than the newest event ({ahead!r}) is treated like a malformed "
                    "one: every event published after the subscription started arrives, none is "
                    "skipped up to that id")
        got: list[StreamItem] = []

        async def take() -> None:
            while len(got) < len(later):
                got.append(await next_item(sub, contract))

        try:  # bounded in total: this subscription heartbeats while nothing comes
            await asyncio.wait_for(take(), WAIT)
        except TimeoutError:
            pass
        assert_events(got, later, contract)
        await sub.aclose()
        await bridge.publish_end(run_id)

    streams_target.run(body)


# -- generated interleavings: gaps on eviction, never a silent skip -----------------

_PUBLISH = st.tuples(st.just("publish"), st.integers(1, 5))
_READ = st.tuples(st.just("read"), st.integers(0, 5), st.integers(1, 4))
_OPS = st.lists(
    st.one_of(
        _PUBLISH,
        _PUBLISH,
        st.tuples(st.just("subscribe"), st.one_of(st.none(), st.integers(0, 30), st.just("-1"))),
        _READ,
        _READ,
        st.tuples(st.just("end")),
    ),
    max_size=25,
)


class _Sub:
    def __init__(self, it: AsyncIterator[StreamItem], next_index: int, requested: str | None) -> None:
        self.it = it
        self.next_index = next_index  # index (into published) of the next event it must yield
        self.requested = requested  # the id it stands at, as a gap must report it
        self.open = True
        self.started = requested is not None  # a cursorless one takes its place when first read

    def has_news(self, published: list[StreamEvent], ended: bool, maxsize: int) -> bool:
        """Whether reading cannot block: an event, a gap or END is due."""
        index = self.next_index if self.started else max(0, len(published) - maxsize)
        return self.open and (index < len(published) or ended)


@pytest.mark.requires("replay")
@given(ops=_OPS)
def test_generated_interleavings_gap_instead_of_skip(streams_target: Any, ops: list[tuple[Any, ...]]) -> None:
    maxsize = 3

    async def step(sub: _Sub, published: list[StreamEvent], ended: bool) -> None:
        """Read one item and check it against the model."""
        first = max(0, len(published) - maxsize)
        if not sub.started:
            # Iteration starts the subscription: no cursor replays what is retained then.
            sub.next_index, sub.started = first, True
        item = await next_item(sub.it, "a subscriber with news receives it")
        if isinstance(item, StreamEvent):
            assert sub.next_index < len(published) and item == published[sub.next_index], (
                "contract: a slow subscriber that falls behind the window gets a StreamGap, never a "
                f"silent skip; expected {published[sub.next_index].id if sub.next_index < len(published) else None}, "
                f"got {item.id}"
            )
            sub.next_index += 1
            sub.requested = item.id
        elif isinstance(item, StreamGap):
            assert sub.next_index < first, (
                f"contract: no StreamGap while the next event is still retained; got {item}"
            )
            want = StreamGap(sub.requested, published[first].id, published[-1].id)
            assert item == want, f"contract: the gap reports cursor and window bounds; {item} != {want}"
            await assert_ended(sub.it, "the subscription ends after a StreamGap")
            sub.open = False
        else:
            assert item is END and ended and sub.next_index == len(published), (
                f"contract: END comes after every event and only once the run ended; got {item!r}"
            )
            await assert_ended(sub.it, "the subscription ends after END")
            sub.open = False

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        published: list[StreamEvent] = []
        subs: list[_Sub] = []
        ended = False
        try:
            for op in ops:
                if op[0] == "publish" and ended:
                    with pytest.raises(StreamEndedError):
                        await bridge.publish(run_id, "values", {"late": True})
                elif op[0] == "publish":
                    published += await publish_many(bridge, run_id, op[1], start=len(published))
                elif op[0] == "end":
                    await bridge.publish_end(run_id)
                    ended = True
                elif op[0] == "subscribe":
                    cursor = op[1]
                    first = max(0, len(published) - maxsize)
                    if cursor is None:
                        sub = _Sub(bridge.subscribe(run_id), first, None)
                    elif cursor == "-1":
                        if not published and not ended:
                            continue  # the tail of a stream that does not exist yet is its start
                        sub = _Sub(
                            bridge.subscribe(run_id, last_event_id="-1", heartbeat_interval=0.01),
                            len(published),
                            published[-1].id if published else None,
                        )
                        sub.started = True
                        # Anchor the tail now: a heartbeat proves the subscription has started.
                        item = await next_item(sub.it, ANCHOR, heartbeats=True)
                        if ended:
                            assert item is END, (
                                f"contract: a malformed cursor on a finished run replays END; got {item!r}"
                            )
                            await assert_ended(sub.it, "the subscription ends after END")
                            sub.open = False
                        else:
                            assert item is HEARTBEAT, (
                                f"contract: '-1' starts at the live tail; got {item!r}"
                            )
                    elif cursor < len(published):
                        sub = _Sub(bridge.subscribe(run_id, last_event_id=published[cursor].id),
                                   cursor + 1, published[cursor].id)
                    else:
                        continue
                    subs.append(sub)
                elif subs:
                    sub = subs[op[1] % len(subs)]
                    for _ in range(op[2]):
                        if not sub.has_news(published, ended, maxsize):
                            break
                        await step(sub, published, ended=ended)
            await bridge.publish_end(run_id)
            for sub in subs:
                while sub.open:
                    await step(sub, published, ended=True)
        finally:
            for sub in subs:
                await sub.it.aclose()  # type: ignore[attr-defined]

    streams_target.run(body, settings=_settings(queue_maxsize=maxsize))


# -- END ----------------------------------------------------------------------------


def test_end_survives_a_full_buffer(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        for count in (3, 5):  # exactly full, and overflowed
            run_id = new_run()
            live = bridge.subscribe(run_id)
            events = await publish_many(bridge, run_id, count)
            await bridge.publish_end(run_id)
            got = await drain(live, "END survives a full buffer")
            assert got[-1] is END and len(got) >= 2, (
                "contract: END never takes a data slot, so it survives a full buffer "
                f"(live subscriber, {count} events into 3 slots); got {got}"
            )
            late = await drain(bridge.subscribe(run_id), "END survives a full buffer")
            assert_events(late, [*events[-3:], END], "END never takes a data slot: a full buffer "
                          f"still holds the last 3 events and then END ({count} published)")

    streams_target.run(body, settings=_settings(queue_maxsize=3))


def test_end_is_idempotent_and_publish_after_end_raises(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 2)
        await bridge.publish_end(run_id)
        await bridge.publish_end(run_id)
        with pytest.raises(StreamEndedError):
            await bridge.publish(run_id, "values", {"late": True})
        got = await drain(bridge.subscribe(run_id), "one END after the events")
        assert_events(got, [*events, END], "publish_end is idempotent (one END) and nothing is "
                      "published after it")

    streams_target.run(body)


@pytest.mark.parametrize("bad", [None, 7, "", b"run"], ids=repr)
def test_run_id_must_be_a_non_empty_string(streams_target: Any, bad: Any) -> None:
    contract = "contract: a run id is a non-empty string; anything else is InvalidStreamInputError"

    async def body(bridge: StreamBridge) -> None:
        for call in (lambda: bridge.publish(bad, "values", {}), lambda: bridge.publish_end(bad),
                     lambda: bridge.cleanup(bad), lambda: bridge.stream_exists(bad)):
            with pytest.raises(InvalidStreamInputError, match="run_id"):
                await call()
        with pytest.raises(InvalidStreamInputError, match="run_id"):  # at the call or the first item
            await asyncio.wait_for(anext(bridge.subscribe(bad)), WAIT)

    try:
        streams_target.run(body)
    except pytest.fail.Exception as exc:  # "DID NOT RAISE"
        raise AssertionError(f"{contract} ({bad!r} was accepted)") from exc


def test_nan_and_infinity_in_data_are_refused_and_nothing_is_published(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        first = await publish_many(bridge, run_id, 1)
        contract = "contract: NaN and Infinity in data are an InvalidStreamInputError; nothing is published"
        for bad in (float("nan"), float("inf"), {"a": [1.0, float("-inf")]}, [{"x": (0, float("nan"))}]):
            try:
                await bridge.publish(run_id, "values", bad)
            except InvalidStreamInputError as exc:
                assert "NaN or Infinity" in str(exc), f"{contract} (the message says why: {exc})"
            else:
                raise AssertionError(f"{contract} ({bad!r} was published)")
        last = await publish_many(bridge, run_id, 1, start=1)
        await bridge.publish_end(run_id)
        got = await drain(bridge.subscribe(run_id), "only the valid events")
        assert_events(got, [*first, *last, END], f"{contract} (no silent null)")

    streams_target.run(body)


# -- heartbeats ---------------------------------------------------------------------


def test_heartbeat_bridge_default_when_idle(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        sub = bridge.subscribe(run_id)
        contract = "an idle subscription yields HEARTBEAT at the bridge default interval"
        got = [await next_item(sub, contract, heartbeats=True) for _ in range(2)]
        assert got == [HEARTBEAT, HEARTBEAT], f"contract: {contract}; got {got}"
        (event,) = await publish_many(bridge, run_id, 1)
        assert await next_item(sub, "events still arrive between heartbeats") == event
        await sub.aclose()

    streams_target.run(body, settings={"stream_bridge": {"heartbeat_interval_seconds": 0.05}})


def test_heartbeat_override_shorter_than_default(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        sub = bridge.subscribe(new_run(), heartbeat_interval=0.05)
        item = await next_item(
            sub,
            "the per-subscription heartbeat override applies (0.05s override, 30s bridge default)",
            heartbeats=True,
        )
        assert item is HEARTBEAT, f"contract: the per-subscription heartbeat override applies; got {item!r}"
        await sub.aclose()

    streams_target.run(body)


def test_heartbeat_override_longer_than_default_for_that_subscription_only(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        slow = bridge.subscribe(run_id, heartbeat_interval=30)
        fast = bridge.subscribe(run_id)
        slow_next = asyncio.ensure_future(anext(slow))
        try:
            for _ in range(4):
                item = await next_item(fast, "the bridge default still applies to other "
                                       "subscriptions", heartbeats=True)
                assert item is HEARTBEAT, f"contract: default heartbeat on idle; got {item!r}"
            assert not slow_next.done(), (
                "contract: the per-subscription heartbeat override applies to that subscription "
                f"only (30s override saw {slow_next.result() if slow_next.done() else None!r} "
                "while the 0.05s default subscription had 4 heartbeats)"
            )
        finally:
            slow_next.cancel()
            await asyncio.gather(slow_next, return_exceptions=True)
            await fast.aclose()

    streams_target.run(body, settings={"stream_bridge": {"heartbeat_interval_seconds": 0.05}})


def test_no_heartbeat_between_events_that_arrive_faster(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 30)
        await bridge.publish_end(run_id)
        sub = bridge.subscribe(run_id, heartbeat_interval=0.2)
        got = [await next_item(sub, "replay", heartbeats=True) for _ in range(31)]
        assert_events(got, [*events, END], "a heartbeat only fills an idle interval, never sits "
                      "between events that arrive faster")

    streams_target.run(body)


# -- cleanup and the late-subscriber window -----------------------------------------


async def _eventually_gone(bridge: StreamBridge, run_id: str, contract: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while await bridge.stream_exists(run_id):
        if loop.time() > deadline:
            raise AssertionError(f"contract: {contract} (still there after {WAIT}s)")
        await asyncio.sleep(0.05)


def test_stream_exists_and_cleanup(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        assert not await bridge.stream_exists(run_id), "contract: a never-published run has no stream"
        waiting = bridge.subscribe(run_id, heartbeat_interval=0.05)
        assert await next_item(waiting, ANCHOR, heartbeats=True) is HEARTBEAT
        assert not await bridge.stream_exists(run_id), (
            "contract: stream_exists is false for a run that only has a subscriber waiting for it "
            "(nothing was published)"
        )
        await waiting.aclose()
        assert not await bridge.stream_exists(run_id), (
            "contract: a subscriber that stops waiting for a run that never started leaves no stream"
        )
        events = await publish_many(bridge, run_id, 2)
        assert await bridge.stream_exists(run_id), "contract: a live run's stream exists"
        follower = bridge.subscribe(run_id, heartbeat_interval=0.05)
        assert [await next_item(follower, "a new subscriber replays the published events") for _ in events] == events
        await bridge.publish_end(run_id)
        assert await bridge.stream_exists(run_id), (
            "contract: a finished run's stream stays readable inside the late-subscriber window"
        )
        late = await drain(bridge.subscribe(run_id), "a late subscriber replays the finished run")
        assert_events(late, [*events, END], "a late subscriber inside the window replays, then END")
        await bridge.cleanup(run_id)
        assert not await bridge.stream_exists(run_id), (
            "contract: stream_exists tells a finished-and-cleaned run from a live one"
        )
        assert await drain(follower, "a follower of a cleaned-up stream gets END") == [END]
        # cleanup of a live run ends its followers too.
        other = new_run()
        await publish_many(bridge, other, 1)
        sub = bridge.subscribe(other, heartbeat_interval=0.05)
        await next_item(sub, "a new subscriber replays the published events")
        await bridge.cleanup(other)
        assert await drain(sub, "cleanup ends followers with END") == [END], (
            "contract: a subscriber following a removed stream receives END"
        )

    streams_target.run(body)


def test_cleanup_with_delay(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        await publish_many(bridge, run_id, 1)
        await bridge.publish_end(run_id)
        await bridge.cleanup(run_id, delay=30)
        assert await bridge.stream_exists(run_id), "contract: cleanup(delay=30) keeps the stream for now"
        await bridge.cleanup(run_id, delay=0.1)
        await _eventually_gone(bridge, run_id, "cleanup(delay=0.1) removes the stream after the delay")
        # A delayed cleanup of a live run ends its followers when it removes the stream.
        live = new_run()
        await publish_many(bridge, live, 1)
        # (A Redis follower notices a removal at its next idle check: one heartbeat.)
        follower = bridge.subscribe(live, heartbeat_interval=0.05)
        await next_item(follower, "a new subscriber replays the published events")
        await bridge.cleanup(live, delay=0.1)
        contract = "a follower of a stream removed by a delayed cleanup gets END"
        try:  # bounded in total: the follower heartbeats while it waits
            got = await asyncio.wait_for(drain(follower, contract), WAIT)
        except TimeoutError:
            raise AssertionError(f"contract: {contract} (nothing but heartbeats within {WAIT}s)") from None
        assert got == [END], f"contract: {contract}; got {got}"

    streams_target.run(body)


def test_late_subscriber_window_then_removed(streams_target: Any) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        events = await publish_many(bridge, run_id, 2)
        await bridge.publish_end(run_id)
        got = await drain(bridge.subscribe(run_id), "late subscriber")
        assert_events(got, [*events, END], "a late subscriber inside the window replays, then END")
        await _eventually_gone(
            bridge, run_id, "after END the stream is removed once late_subscriber_window_seconds pass"
        )

    streams_target.run(body, settings=_settings(late_subscriber_window_seconds=0.3))


# -- several processes --------------------------------------------------------------

_PUBLISHER = textwrap.dedent(
    """
    import asyncio, os, sys
    from runstore.capabilities import Kind
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL
    from runstore.conformance.processes import load_plugins_from_env

    load_plugins_from_env()

    async def main():
        url = BackendURL.parse(os.environ["RUNSTORE_XP_URL"])
        run_id = os.environ["RUNSTORE_XP_RUN"]
        spec = get_backends().of(Kind.STREAMS).for_url(url)
        async with BackendOptions.scope(Settings()) as options:
            bridge = await spec.open(url, options)
            for i in range(20):
                await bridge.publish(run_id, "values", {"i": i, "pid": os.getpid()})
            await bridge.publish_end(run_id)

    asyncio.run(main())
    """
)


@pytest.mark.requires("cross_process")
def test_publisher_and_subscriber_in_different_processes(
    streams_target: Any, request: pytest.FixtureRequest
) -> None:
    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        sub = bridge.subscribe(run_id)
        reader = asyncio.ensure_future(drain(sub, "a subscriber sees another process's events"))
        env = {
            **os.environ,
            "RUNSTORE_XP_URL": streams_target.url.render(hide_password=False),
            "RUNSTORE_XP_RUN": run_id,
            **plugins_env(development_plugins(request.config)),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PUBLISHER, env=env, stderr=subprocess.PIPE
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, f"publisher process failed: {err.decode(errors='replace')[-2000:]}"
        got = await reader
        assert got[-1] is END and [g.data["i"] for g in got[:-1]] == list(range(20)), (  # type: ignore[union-attr]
            "contract: with cross_process, a subscriber receives in order the events and END "
            f"published by another process; got {got}"
        )
        assert all(g.data["pid"] != os.getpid() for g in got[:-1]), "events came from the other process"  # type: ignore[union-attr]

    streams_target.run(body)
