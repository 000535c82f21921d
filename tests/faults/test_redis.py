"""Redis faults: connections killed while idle, half-open networks, server restarts and
outages, for the stream bridge and the delta-history cache.

Every test runs against its own redis-server (tests/faults/servers.py), often through a
TCP proxy, and checks the guarantee with counts: what was acknowledged is delivered
exactly once, nothing unacknowledged-and-unsent appears, and the bridge keeps working
without being reopened.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from runstore import END, HEARTBEAT, StreamEvent
from runstore.errors import BackendUnavailableError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.streams.protocol import StreamGap
from runstore.urls import BackendURL

from .servers import RedisServer, TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.redis]

#: Generous bound of any wait in these tests (never a timing assertion).
WAIT = 30.0


@contextlib.asynccontextmanager
async def open_bridge(url: str, **stream_bridge: Any) -> AsyncIterator[Any]:
    """A Redis bridge on ``url`` (heartbeats every 0.05 s unless told otherwise)."""
    from runstore.plugins.redis.streams import RedisStreamBridge

    settings = Settings().merged({"stream_bridge": {"heartbeat_interval_seconds": 0.05, **stream_bridge}})
    async with BackendOptions.scope(settings) as options:
        bridge = await RedisStreamBridge.open(BackendURL.parse(url), options)
        options.on_close(bridge.close)
        yield bridge


async def replay(url: str, run_id: str) -> list[Any]:
    """Everything a fresh subscriber on a fresh bridge sees of ``run_id`` after publish_end."""
    async with open_bridge(url) as bridge:
        await bridge.publish_end(run_id)
        items = []
        async for item in bridge.subscribe(run_id):
            if item is not HEARTBEAT:
                items.append(item)
        return items


def tally(items: list[Any], acknowledged: dict[str, Any], maybe: set[Any]) -> dict[str, int]:
    """Counts of a run: acknowledged, lost (acknowledged but missing), duplicated data, and
    strays (present though never acknowledged nor possibly written); checks ids and END."""
    assert items and items[-1] is END, f"the replay ends with END: {items[-3:]}"
    events = [item for item in items if isinstance(item, StreamEvent)]
    assert len(events) == len(items) - 1, f"nothing but events before END: {items}"
    seqs = [int(e.id.split("-")[1]) for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True, f"consecutive ids: {seqs}"
    data = [e.data for e in events]
    by_id = {e.id: e.data for e in events}
    return {
        "acknowledged": len(acknowledged),
        "lost": sum(1 for i, d in acknowledged.items() if by_id.get(i) != d),
        "duplicated": len(data) - len(set(data)),
        "strays": sum(1 for d in data if d not in acknowledged.values() and d not in maybe),
    }


# -- a connection killed while idle --------------------------------------------------


KILLS: dict[str, Callable[[RedisServer, TcpProxy], object]] = {
    "server closes it (CLIENT KILL)": lambda server, proxy: server.kill_clients(),
    "network resets it (RST)": lambda server, proxy: proxy.drop(reset=True),
    "network closes it (FIN)": lambda server, proxy: proxy.drop(reset=False),
}


@pytest.mark.parametrize("kill", sorted(KILLS))
async def test_connection_killed_while_idle_does_not_fail_the_next_call(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy], kill: str, fault_report: Any
) -> None:
    proxy = tcp_proxy(redis_server.port)
    url = proxy.url(redis_server.url())
    trials = 10
    acknowledged: dict[str, Any] = {}
    async with open_bridge(url) as bridge:
        follower = bridge.subscribe("idle")
        got: list[Any] = []

        async def follow() -> None:
            async for item in follower:
                if item is not HEARTBEAT:
                    got.append(item)

        following = asyncio.ensure_future(follow())
        for i in range(trials):
            acknowledged[await bridge.publish("idle", "v", f"before-{i}")] = f"before-{i}"
            await asyncio.sleep(0.05)  # idle: the loop sees the close before the next call
            KILLS[kill](redis_server, proxy)
            await asyncio.sleep(0.05)
            assert await bridge.stream_exists("idle"), "a read after the kill succeeds"
            acknowledged[await bridge.publish("idle", "v", f"after-{i}")] = f"after-{i}"
        await bridge.publish_end("idle")
        await asyncio.wait_for(following, WAIT)
    assert [g.data for g in got[:-1]] == list(acknowledged.values()) and got[-1] is END, (
        "the follower saw every acknowledged event once, in order, across the kills"
    )
    counts = tally(await replay(redis_server.url(), "idle"), acknowledged, set())
    assert counts == {"acknowledged": 2 * trials, "lost": 0, "duplicated": 0, "strays": 0}
    fault_report.add(f"redis: connection killed while idle, {kill}", trials=trials, **counts)


# -- half-open network: a peer that stops answering ------------------------------------


async def test_heartbeats_flow_while_a_redis_read_is_stuck(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    bounds = {"socket_timeout": "5", "operation_timeout": "20"}
    async with open_bridge(proxy.url(redis_server.url(**bounds))) as bridge, \
            open_bridge(redis_server.url()) as direct:
        sub = bridge.subscribe("stuck")
        await direct.publish("stuck", "v", 1)
        first = await asyncio.wait_for(anext(sub), WAIT)
        assert isinstance(first, StreamEvent) and first.data == 1
        proxy.blackhole()
        await direct.publish("stuck", "v", 2)  # the black hole holds its wake-up
        heartbeats = 0
        while heartbeats < 20:
            item = await asyncio.wait_for(anext(sub), WAIT)
            assert item is HEARTBEAT, f"nothing but heartbeats can pass the black hole: {item!r}"
            heartbeats += 1
        assert bridge.calls.outages == 0, "the reads were still waiting (not failed and retried)"
        proxy.pass_traffic()
        item = HEARTBEAT
        while item is HEARTBEAT:
            item = await asyncio.wait_for(anext(sub), WAIT)
        assert item == StreamEvent("0-2", "v", 2), "after the network heals the follower resumes"
        await sub.aclose()


async def test_publish_into_a_half_open_network_is_bounded_and_never_doubled(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy], fault_report: Any
) -> None:
    proxy = tcp_proxy(redis_server.port)
    bounds = {"socket_timeout": "0.5", "operation_timeout": "2", "health_check_interval": "0"}
    acknowledged: dict[str, Any] = {}
    async with open_bridge(proxy.url(redis_server.url(**bounds))) as bridge:
        acknowledged[await bridge.publish("half", "v", "a")] = "a"
        proxy.blackhole()
        with pytest.raises(BackendUnavailableError) as info:
            await asyncio.wait_for(bridge.publish("half", "v", "b"), WAIT)
        assert info.value.write_may_have_happened, "sent into the black hole: its outcome is unknown"
        assert "may have happened" in str(info.value)
        with pytest.raises(BackendUnavailableError) as read:
            await asyncio.wait_for(bridge.stream_exists("half"), WAIT)
        assert read.value.write_may_have_happened is False
        proxy.pass_traffic()
        acknowledged[await bridge.publish("half", "v", "c")] = "c"
    items = await replay(redis_server.url(), "half")
    counts = tally(items, acknowledged, {"b"})
    assert counts == {"acknowledged": 2, "lost": 0, "duplicated": 0, "strays": 0}, counts
    fault_report.add("redis: publish into a black hole (reply lost)", trials=1, **counts)


async def test_publish_whose_health_check_fails_reports_nothing_written(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy], fault_report: Any
) -> None:
    proxy = tcp_proxy(redis_server.port)
    # A health check before every command that follows an idle millisecond.
    bounds = {"socket_timeout": "0.5", "operation_timeout": "2", "health_check_interval": "0.001"}
    acknowledged: dict[str, Any] = {}
    async with open_bridge(proxy.url(redis_server.url(**bounds))) as bridge:
        acknowledged[await bridge.publish("checked", "v", "a")] = "a"
        await asyncio.sleep(0.01)
        proxy.blackhole()
        with pytest.raises(BackendUnavailableError) as info:
            await asyncio.wait_for(bridge.publish("checked", "v", "b"), WAIT)
        assert info.value.write_may_have_happened is False, "the PING failed, the publish was never sent"
        proxy.pass_traffic()
        acknowledged[await bridge.publish("checked", "v", "c")] = "c"
    counts = tally(await replay(redis_server.url(), "checked"), acknowledged, set())
    assert counts == {"acknowledged": 2, "lost": 0, "duplicated": 0, "strays": 0}, counts
    fault_report.add("redis: publish after a failed health check (half-open)", trials=1, **counts)


async def test_health_checks_never_interleave_with_the_connection_handshake(redis_server: RedisServer) -> None:
    """A health check due on every command must not PING inside the pipelined handshake
    (CLIENT SETINFO, SELECT), which would read a handshake reply as its PONG."""
    async with open_bridge(redis_server.url(db=1, health_check_interval="0.000001")) as bridge:
        ids = [await bridge.publish("checked-often", "v", n) for n in range(5)]
        await bridge.calls.pool.disconnect()
        ids.append(await bridge.publish("checked-often", "v", 5))
    assert ids == [f"0-{n}" for n in range(1, 7)]


async def test_a_call_cut_off_while_connecting_leaves_no_stale_reply(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy], fault_report: Any
) -> None:
    """The operation deadline ends a call in the middle of a new connection's handshake; the
    handshake's replies arrive later and must never be read as another call's reply."""
    proxy = tcp_proxy(redis_server.port)
    bounds = {"socket_timeout": "5", "operation_timeout": "0.3", "health_check_interval": "0"}
    acknowledged: dict[str, Any] = {}
    trials = 5
    async with open_bridge(proxy.url(redis_server.url(**bounds))) as bridge:
        for i in range(trials):
            await bridge.calls.pool.disconnect()
            proxy.blackhole()  # the next connection is accepted, its handshake never answered
            with pytest.raises(BackendUnavailableError) as info:
                await bridge.publish("stale", "v", f"cut-{i}")
            assert info.value.write_may_have_happened is False, "cut off before the publish was sent"
            proxy.pass_traffic()  # the held handshake reaches the server; its replies come back
            for n in range(3):  # ... while these publishes run
                acknowledged[await bridge.publish("stale", "v", f"ok-{i}-{n}")] = f"ok-{i}-{n}"
    counts = tally(await replay(redis_server.url(), "stale"), acknowledged, set())
    assert counts == {"acknowledged": 3 * trials, "lost": 0, "duplicated": 0, "strays": 0}, counts
    fault_report.add("redis: deadline cuts a call off mid-handshake", trials=trials, **counts)


# -- server restarts and outages ---------------------------------------------------------


async def _workload(url: str, server: RedisServer, run_id: str, *, down_for: float) -> tuple[
    dict[str, Any], set[Any], list[Any], int
]:
    """Publish steadily while a follower reads; SIGKILL the server mid-way, restart it after
    ``down_for`` seconds. Returns (acknowledged id -> data, maybe-written data, follower items,
    how many publishes were acknowledged: a server that lost its data hands out ids again,
    so the mapping keeps only the last of each id)."""
    acknowledged: dict[str, Any] = {}
    acknowledged_count = 0
    maybe: set[Any] = set()
    async with open_bridge(url) as bridge:
        follower = bridge.subscribe(run_id)
        seen: list[Any] = []

        async def follow() -> None:
            async for item in follower:
                if item is not HEARTBEAT:
                    seen.append(item)

        following = asyncio.ensure_future(follow())

        async def crash() -> None:
            await asyncio.to_thread(server.sigkill)
            await asyncio.sleep(down_for)
            await asyncio.to_thread(server.start)

        crasher: asyncio.Future[None] | None = None
        i = 0
        after_restart = 0
        while after_restart < 20:
            if i == 20:
                crasher = asyncio.ensure_future(crash())
            try:
                acknowledged[await bridge.publish(run_id, "v", i)] = i
                acknowledged_count += 1
                if crasher is not None and crasher.done():
                    after_restart += 1
            except BackendUnavailableError as exc:
                if exc.write_may_have_happened:
                    maybe.add(i)
            i += 1
            await asyncio.sleep(0.005)
        assert crasher is not None
        await crasher
        await bridge.publish_end(run_id)
        await asyncio.wait_for(following, WAIT)
    return acknowledged, maybe, seen, acknowledged_count


async def test_restart_with_persistence_loses_nothing_acknowledged(fault_report: Any) -> None:
    with RedisServer(persistent=True) as server:
        acknowledged, maybe, seen, count = await _workload(server.url(), server, "durable", down_for=0.3)
        counts = tally(await replay(server.url(), "durable"), acknowledged, maybe)
    assert counts["acknowledged"] == count, "the persistent server handed out no id twice"
    assert counts["lost"] == counts["duplicated"] == counts["strays"] == 0, counts
    assert seen[-1] is END and not any(isinstance(s, StreamGap) for s in seen), (
        "the follower resumed from its last id (the stream survived the restart)"
    )
    assert [s.data for s in seen[:-1]] == [
        d for d in sorted({*acknowledged.values(), *maybe}) if d in {s.data for s in seen[:-1]}
    ], "in publish order, each once"
    assert set(acknowledged.values()) <= {s.data for s in seen[:-1]}, "the follower saw every acknowledged event"
    fault_report.add("redis: SIGKILL + restart mid-workload (append-only file)", trials=1, **counts)


async def test_restart_without_persistence_gives_followers_a_gap(fault_report: Any) -> None:
    with RedisServer() as server:
        acknowledged, maybe, seen, count = await _workload(server.url(), server, "volatile", down_for=0.3)
        items = await replay(server.url(), "volatile")
    assert isinstance(seen[-1], StreamGap), (
        f"the stream was lost with the server: the follower gets a gap, not END: {seen[-3:]}"
    )
    assert END not in seen
    # What the server still holds is what was published after the restart, each once.
    events = [i for i in items if isinstance(i, StreamEvent)]
    assert [e.id for e in events] == [f"0-{n}" for n in range(1, len(events) + 1)]
    assert len({e.data for e in events}) == len(events) >= 20
    assert all(acknowledged.get(e.id) == e.data or e.data in maybe for e in events)
    kept = sum(1 for e in events if acknowledged.get(e.id) == e.data)
    # Lost with the server's memory, as configured (no persistence): what came before the kill.
    fault_report.add(
        "redis: SIGKILL + restart mid-workload (no persistence)", trials=1,
        acknowledged=count, lost=count - kept, duplicated=0,
    )


async def test_outage_longer_than_the_deadline_then_recovery(fault_report: Any) -> None:
    with RedisServer() as server:
        async with open_bridge(server.url(operation_timeout="1")) as bridge:
            first = await bridge.publish("outage", "v", 0)
            await asyncio.to_thread(server.sigkill)
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as info:
                await bridge.publish("outage", "v", 1)
            assert info.value.write_may_have_happened is False, "every attempt was refused"
            with pytest.raises(BackendUnavailableError):
                await bridge.stream_exists("outage")
            assert time.monotonic() - started < WAIT
            await asyncio.to_thread(server.start)
            second = await bridge.publish("outage", "v", 2)
            assert second == "0-1", "the stream was lost with the server, publishing starts over"
            assert first == "0-1"
    fault_report.add("redis: outage longer than operation_timeout", trials=1,
                     acknowledged=2, lost=1, duplicated=0)


async def test_history_cache_degrades_to_misses_and_recovers() -> None:
    from runstore.plugins.redis.cache import RedisHistoryCache

    with RedisServer() as server:
        settings = Settings().merged({"redis": {"socket_timeout_seconds": 2}})
        async with BackendOptions.scope(settings) as options:
            cache = await RedisHistoryCache.open(BackendURL.parse(server.url()), options)
            options.on_close(cache.close)
            entry: Any = {"writes": [("t", "messages", ["m"])]}
            await cache.set("t", "k", entry)
            assert await cache.get("t", "k") == entry
            await asyncio.to_thread(server.sigkill)
            assert await cache.get("t", "k") is None, "a dead server is a miss"
            await cache.set("t", "k2", entry)  # a skipped write, no error
            errors = cache.errors
            assert errors >= 1
            assert await cache.get("t", "k") is None
            assert cache.errors == errors, "right after a failure, misses without touching Redis"
            await asyncio.to_thread(server.start)
            deadline = time.monotonic() + WAIT
            while True:
                await cache.set("t", "k3", entry)
                if await cache.get("t", "k3") == entry:
                    break
                assert time.monotonic() < deadline, "the cache works again after the restart"
                await asyncio.sleep(0.2)
