"""Unit tests of the built-in bridges beyond the conformance suite: options, Redis layout,
TTLs, trimming, pooling, retries, publisher errors and pipelined publishing."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runstore import END, StreamEvent
from runstore.errors import BackendUnavailableError, ConfigError, InvalidURLError, StreamEndedError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.streams.protocol import (
    HEARTBEAT,
    StreamGap,
    format_event_id,
    heartbeat_loop,
    parse_event_id,
    resolve_heartbeat,
)
from runstore.urls import BackendURL

# -- shared helpers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [("0-5", (0, 5)), ("5", (5, 0)), ("12-3", (12, 3)), (" 0-1 ", (0, 1)),
     ("-1", None), ("", None), ("abc", None), ("1-2-3", None), ("0-x", None),
     (None, None), (str(2**64) + "-0", None)],
)
def test_parse_event_id(text: Any, key: Any) -> None:
    assert parse_event_id(text) == key
    if key is not None:
        assert parse_event_id(format_event_id(key)) == key


def test_resolve_heartbeat() -> None:
    assert resolve_heartbeat(None, 15) == 15
    assert resolve_heartbeat(0.5, 15) == 0.5
    for bad in (0, -1):
        with pytest.raises(ValueError, match="heartbeat_interval"):
            resolve_heartbeat(bad, 15)


async def test_heartbeat_loop_fills_only_silences() -> None:
    batches: list[list[Any]] = [[], ["a", "b"], [], [END]]
    calls: list[float] = []

    async def poll(timeout: float) -> list[Any]:
        calls.append(timeout)
        batch = batches.pop(0)
        if not batch:
            await asyncio.sleep(timeout)
        return batch

    got = [item async for item in heartbeat_loop(poll, 0.01)]
    assert got == [HEARTBEAT, "a", "b", HEARTBEAT, END]


# -- memory ---------------------------------------------------------------------------


async def test_memory_open_rejects_options_and_reads_settings() -> None:
    from runstore.plugins.memory.streams import MemoryStreamBridge

    settings = Settings().merged({"stream_bridge": {"queue_maxsize": 7, "heartbeat_interval_seconds": 2}})
    async with BackendOptions.scope(settings) as options:
        bridge = await MemoryStreamBridge.open(BackendURL.parse("memory://"), options)
        assert (bridge.queue_maxsize, bridge.heartbeat_interval) == (7, 2)
        with pytest.raises(InvalidURLError):
            await MemoryStreamBridge.open(BackendURL.parse("memory://?prefix=x"), options)


async def test_memory_subscriber_of_unpublished_run_leaves_no_trace() -> None:
    from runstore.plugins.memory.streams import MemoryStreamBridge

    bridge = MemoryStreamBridge(heartbeat_interval=0.01)
    sub = bridge.subscribe("nothing")
    assert await anext(sub) is HEARTBEAT
    await sub.aclose()
    assert not bridge._runs and not await bridge.stream_exists("nothing")


async def test_memory_run_that_never_ends_expires_like_a_redis_stream() -> None:
    from runstore.plugins.memory.streams import MemoryStreamBridge

    bridge = MemoryStreamBridge(heartbeat_interval=0.05, stream_ttl_seconds=0.2)
    await bridge.publish("abandoned", "values", 1)
    follower = bridge.subscribe("abandoned")
    assert (await anext(follower)).data == 1
    got = [item async for item in follower if item is not HEARTBEAT]
    assert got == [END], "the expired stream ends its followers, like a cleanup"
    assert not bridge._runs and not await bridge.stream_exists("abandoned")
    assert await bridge.publish("abandoned", "values", 2) == "0-1", "the run id is free again"
    await bridge.close()


async def test_memory_expiry_follows_the_last_call() -> None:
    """Each publish moves the deadline to now + stream_ttl; END and cleanup(delay=) set it too."""
    from runstore.plugins.memory.streams import MemoryStreamBridge

    loop = asyncio.get_running_loop()
    bridge = MemoryStreamBridge(stream_ttl_seconds=1000, late_subscriber_window=50)
    await bridge.publish("r", "values", 1)
    run = bridge._runs["r"]
    timer = run.timer
    before = loop.time()
    await bridge.publish("r", "values", 2)
    assert before + 1000 <= run.expires_at <= loop.time() + 1000 and run.timer is timer, (
        "a publish only moves the deadline of the run's one timer"
    )
    await bridge.cleanup("r", delay=5)
    assert run.expires_at <= loop.time() + 5 and run.timer.when() == run.expires_at
    await bridge.publish("r", "values", 3)
    assert run.expires_at >= loop.time() + 999, "a publish after cleanup(delay=) wins, as PEXPIRE does"
    await bridge.publish_end("r")
    assert run.expires_at <= loop.time() + 50, "END leaves the late-subscriber window"
    await bridge.close()


# -- redis ----------------------------------------------------------------------------


def test_importing_the_plugin_does_not_import_redis() -> None:
    code = (
        "import sys, runstore.plugins.redis, runstore.plugins.redis.streams; "
        "assert 'redis' not in sys.modules, 'redis imported at plugin import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _settings(**stream_bridge: Any) -> Settings:
    return Settings().merged({"stream_bridge": {"heartbeat_interval_seconds": 30, **stream_bridge}})


@pytest.fixture
async def options() -> AsyncIterator[BackendOptions]:
    async with BackendOptions.scope(_settings(queue_maxsize=3, stream_ttl_seconds=100)) as options:
        yield options


async def _open(redis_url: str, options: BackendOptions) -> Any:
    from runstore.plugins.redis.streams import RedisStreamBridge

    bridge = await RedisStreamBridge.open(BackendURL.parse(redis_url), options)
    options.on_close(bridge.close)
    return bridge


def _raw(redis_url: str) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(BackendURL.parse(redis_url).without_query("prefix").render(hide_password=False))


@pytest.mark.redis
async def test_redis_keys_trimming_and_ttls(redis_url: str, options: BackendOptions) -> None:
    bridge = await _open(redis_url, options)
    prefix = BackendURL.parse(redis_url).option("prefix")
    assert prefix and bridge.prefix == prefix
    run = f"keys-{uuid.uuid4().hex}"
    ids = [await bridge.publish(run, "values", {"i": i}) for i in range(5)]
    assert ids == [f"0-{i}" for i in range(1, 6)], "ids are the stream ids"
    raw = _raw(redis_url)
    try:
        keys = [k.decode() async for k in raw.scan_iter(match=f"*{run}*")]
        assert keys == [f"{prefix}stream:{run}"], keys
        key = bridge.key(run)
        assert await raw.xlen(key) == 3, "exact MAXLEN at queue_maxsize"
        ttl = await raw.pttl(key)
        assert 0 < ttl <= 100_000, "rolling TTL from stream_ttl_seconds"
        await raw.pexpire(key, 50_000)
        await bridge.publish(run, "values", {"i": 5})
        assert await raw.pttl(key) > 50_000, "publish refreshes the TTL"
        await bridge.publish_end(run)
        assert await raw.xlen(key) == 4, "END is one extra entry, evicting no data"
        assert 0 < await raw.pttl(key) <= 60_000, "after END the key lives for the window"
        await bridge.cleanup(run, delay=5)
        assert 0 < await raw.pttl(key) <= 5_000
    finally:
        await raw.aclose()


@pytest.mark.redis
async def test_redis_url_options_and_pool_bound(redis_url: str) -> None:
    from runstore.plugins.redis.streams import RedisStreamBridge

    async with BackendOptions.scope(Settings().merged({"redis": {"max_connections": 5}})) as options:
        bridge = await _open(redis_url, options)
        assert bridge.calls.pool.max_connections == 5
        with pytest.raises(InvalidURLError, match="prefix"):
            await RedisStreamBridge.open(BackendURL.parse(redis_url).with_query(bogus="1"), options)
        for bad in ({"socket_timeout": "0"}, {"operation_timeout": "soon"}, {"health_check_interval": "-1"},
                    {"socket_connect_timeout": "inf"}):
            with pytest.raises(InvalidURLError, match=f"{next(iter(bad))}=.*seconds"):
                await RedisStreamBridge.open(BackendURL.parse(redis_url).with_query(**bad), options)
        with pytest.raises(InvalidURLError, match=r"must be a number \(redis://host:6379/0, /1, ...\); got 'notadb'"):
            await RedisStreamBridge.open(BackendURL.parse(redis_url.replace("/0?", "/notadb?")), options)
        # A number the server has no database for: its refusal, once, not retried nor raw.
        with pytest.raises(InvalidURLError, match=r"no database 99999, which the URL path names .*0-15 by default") as info:
            await RedisStreamBridge.open(BackendURL.parse(redis_url.replace("/0?", "/99999?")), options)
        assert "out of range" in str(info.value.__cause__)
    async with BackendOptions.scope(Settings().merged({"redis": {"max_connections": 1}})) as options:
        with pytest.raises(ConfigError, match="max_connections"):
            await RedisStreamBridge.open(BackendURL.parse(redis_url), options)


@pytest.mark.redis
async def test_redis_many_subscribers_within_a_small_pool(redis_url: str) -> None:
    """One blocking reader per bridge: 30 followers do not need 30 connections."""
    settings = _settings().merged({"redis": {"max_connections": 4}})
    async with BackendOptions.scope(settings) as options:
        bridge = await _open(redis_url, options)

        async def follow() -> list[Any]:
            return [item async for item in bridge.subscribe("crowd")]

        readers = [asyncio.ensure_future(follow()) for _ in range(30)]
        await asyncio.sleep(0.1)
        ids = [await bridge.publish("crowd", "values", i) for i in range(20)]
        await bridge.publish_end("crowd")
        results = await asyncio.wait_for(asyncio.gather(*readers), 30)
        for got in results:
            assert [g.id for g in got[:-1]] == ids and got[-1] is END


@pytest.mark.redis
async def test_redis_concurrent_publishes_are_pipelined_in_call_order(
    redis_url: str, options: BackendOptions
) -> None:
    settings = _settings(queue_maxsize=500)
    async with BackendOptions.scope(settings) as options:
        bridge = await _open(redis_url, options)
        ids = await asyncio.gather(*(bridge.publish("burst", "values", i) for i in range(300)))
        assert ids == [f"0-{i}" for i in range(1, 301)]
        await bridge.publish_end("burst")
        got = [item async for item in bridge.subscribe("burst")]
        assert [g.data for g in got[:-1]] == list(range(300)) and got[-1] is END


@pytest.mark.redis
async def test_redis_publish_after_end_raises_also_when_pipelined(
    redis_url: str, options: BackendOptions
) -> None:
    bridge = await _open(redis_url, options)
    await bridge.publish_end("done")
    results = await asyncio.gather(
        *(bridge.publish("done", "values", i) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, StreamEndedError) for r in results), results


def _break_connections(bridge: Any) -> None:
    """Point the pool at a port nobody listens on, dropping live connections."""
    pool = bridge.calls.pool
    pool.connection_kwargs["port"] = 1
    for conn in [*pool._available_connections, *pool._in_use_connections]:
        conn.port = 1


def _short_deadline(bridge: Any, seconds: float = 0.3) -> None:
    """Give every call of ``bridge`` a short operation deadline (tests of giving up).

    The connect and reply bounds shrink with it, so a call stuck connecting gives up
    within the test's deadline too.
    """
    import dataclasses

    bridge.calls.timeouts = dataclasses.replace(
        bridge.calls.timeouts, operation_timeout=seconds, socket_connect_timeout=seconds, socket_timeout=seconds
    )
    bridge.calls.retry_backoff = (0.01, 0.02, 0.04)


@pytest.mark.redis
async def test_redis_unsent_publish_is_retried_then_reported_unwritten(
    redis_url: str, options: BackendOptions
) -> None:
    bridge = await _open(redis_url, options)
    await bridge.publish("x", "values", 1)
    await bridge.calls.pool.disconnect()
    _break_connections(bridge)
    _short_deadline(bridge)
    with pytest.raises(BackendUnavailableError) as info:
        await bridge.publish("x", "values", 2)
    assert info.value.write_may_have_happened is False, "a refused connection sent nothing"
    assert "nothing was written" in str(info.value) and info.value.__cause__ is not None
    results = await asyncio.gather(*(bridge.publish("x", "v", i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, BackendUnavailableError) and not r.write_may_have_happened for r in results), results


@pytest.mark.redis
async def test_redis_reader_retries_until_the_deadline_then_raises(
    redis_url: str, options: BackendOptions, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = await _open(redis_url, options)
    await bridge.publish("y", "values", 1)
    await bridge.calls.pool.disconnect()
    _break_connections(bridge)
    _short_deadline(bridge)
    caplog.set_level(logging.DEBUG, logger="runstore.plugins.redis.client")
    with pytest.raises(BackendUnavailableError) as info:
        await bridge.stream_exists("y")
    assert info.value.write_may_have_happened is False
    retries = [r for r in caplog.records if "retrying" in r.message]
    assert len(retries) >= 2 and [r.levelno for r in retries[:2]] == [logging.WARNING, logging.DEBUG], (
        "one warning per failing call, the further retries at debug level"
    )
    with pytest.raises(BackendUnavailableError):
        await anext(bridge.subscribe("y"))


@pytest.mark.redis
async def test_redis_close_against_a_dead_server_does_not_retry_its_cleanup(
    redis_url: str, options: BackendOptions, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing wakes the reader and deletes its control stream with one attempt each: a
    dead server costs one refused connect, not the retry budget of a normal call."""
    bridge = await _open(redis_url, options)
    await bridge.publish("c", "values", 1)
    sub = bridge.subscribe("c")
    assert (await anext(sub)).data == 1  # the reader (and its control stream) now exists
    await sub.aclose()
    assert bridge._wakers, "the test needs a running reader"
    await bridge.calls.pool.disconnect()
    _break_connections(bridge)
    caplog.set_level(logging.DEBUG, logger="runstore.plugins.redis.client")
    await bridge.close()
    retried = [
        r.message
        for r in caplog.records
        if "retrying" in r.message and (": close " in r.message or ": poke " in r.message)
    ]
    assert not retried, f"close retried its best-effort cleanup: {retried}"


@pytest.mark.redis
async def test_redis_reader_survives_a_short_outage(redis_url: str, options: BackendOptions) -> None:
    bridge = await _open(redis_url, options)
    await bridge.publish("z", "values", 1)
    pool = bridge.calls.pool
    await pool.disconnect()
    real_port = pool.connection_kwargs["port"]
    _break_connections(bridge)

    async def heal() -> None:
        await asyncio.sleep(0.1)
        pool.connection_kwargs["port"] = real_port
        for conn in [*pool._available_connections, *pool._in_use_connections]:
            conn.port = real_port

    healer = asyncio.ensure_future(heal())
    assert await bridge.stream_exists("z"), "a read retried after the outage succeeds"
    assert await bridge.publish("z", "values", 2) == "0-2", "so does an unsent publish"
    await healer


@pytest.mark.redis
async def test_redis_slow_subscriber_gets_gap(redis_url: str, options: BackendOptions) -> None:
    bridge = await _open(redis_url, options)  # queue_maxsize 3
    sub = bridge.subscribe("slow")
    first = asyncio.ensure_future(anext(sub))
    ids = [await bridge.publish("slow", "values", 0)]
    assert await asyncio.wait_for(first, 10) == StreamEvent(ids[0], "values", 0)
    ids += [await bridge.publish("slow", "values", i) for i in range(1, 10)]
    got = await asyncio.wait_for(anext(sub), 10)
    assert got == StreamGap(ids[0], ids[7], ids[9])
    with pytest.raises(StopAsyncIteration):
        await anext(sub)


@pytest.mark.redis
async def test_redis_scripts_load_when_the_server_lacks_them(
    redis_url: str, options: BackendOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOSCRIPT (server restart or SCRIPT FLUSH) loads the script and resends, direct and
    pipelined. Simulated with scripts the server has never seen (no global flush)."""
    import uuid

    from runstore.plugins.redis import scripts as module

    def fresh() -> None:
        tag = f"\n-- {uuid.uuid4().hex}\n"
        for name in ("PUBLISH", "PUBLISH_END", "SNAPSHOT"):
            monkeypatch.setattr(module, name, module.LuaScript(getattr(module, name).text + tag))

    bridge = await _open(redis_url, options)
    fresh()
    assert await bridge.publish("noscript", "values", 0) == "0-1"
    fresh()
    ids = await asyncio.gather(*(bridge.publish("noscript", "values", i) for i in range(1, 6)))
    assert ids == ["0-2", "0-3", "0-4", "0-5", "0-6"]
    fresh()
    await bridge.publish_end("noscript")
    fresh()
    got = [item async for item in bridge.subscribe("noscript")]
    assert [g.data for g in got[:-1]] == [3, 4, 5] and got[-1] is END  # queue_maxsize 3


async def test_notifier_never_loses_a_wakeup() -> None:
    from runstore.streams.protocol import Notifier

    news = Notifier()
    since = news.version
    news.notify()  # lands between "look for items" and "wait"
    assert await news.wait(30, since) is True, "a notification after `since` returns at once"
    assert await news.wait(0.01, news.version) is False, "timeout without news"
    since = news.version
    waiters = [asyncio.ensure_future(news.wait(30, since)) for _ in range(5)]
    await asyncio.sleep(0)
    news.notify()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True] * 5


@pytest.mark.redis
async def test_redis_follower_raises_when_the_reader_gives_up(
    redis_url: str, options: BackendOptions
) -> None:
    bridge = await _open(redis_url, options)
    _short_deadline(bridge)
    await bridge.publish("lost", "values", 0)
    sub = bridge.subscribe("lost")
    assert (await anext(sub)).data == 0
    pending = asyncio.ensure_future(anext(sub))
    await asyncio.sleep(0.1)  # the waker is blocked in XREAD now
    _break_connections(bridge)
    await bridge.calls.pool.disconnect()
    with pytest.raises(BackendUnavailableError):
        await asyncio.wait_for(pending, 10)
