"""Errors from opening the Redis backends name the server they are about (password masked),
and a database the server does not have is `InvalidURLError` for the bridge and the history
cache alike."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from runstore.errors import BackendUnavailableError, InvalidURLError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _no_database_url(redis_url: str) -> BackendURL:
    url = BackendURL.parse(redis_url)
    return BackendURL(
        scheme=url.scheme, username=url.username, password=url.password, host=url.host, port=url.port,
        path="/99999", query=url.query,
    )


async def test_bridge_open_error_names_the_url_without_its_password() -> None:
    from runstore.plugins.redis.streams import RedisStreamBridge

    port = _closed_port()
    url = BackendURL.parse(f"redis://:s3cret-pw@127.0.0.1:{port}/2?operation_timeout=0.5&prefix=p:")
    async with BackendOptions.scope(Settings()) as options:
        with pytest.raises(BackendUnavailableError) as info:
            await RedisStreamBridge.open(url, options)
    message = str(info.value)
    assert message.startswith(f"redis stream bridge at redis://:***@127.0.0.1:{port}/2 is unavailable during open"), message
    assert "s3cret-pw" not in message
    assert info.value.backend == f"redis stream bridge at redis://:***@127.0.0.1:{port}/2"
    assert info.value.write_may_have_happened is False


@pytest.mark.redis
async def test_bridge_and_cache_refuse_a_database_the_server_does_not_have(redis_url: str) -> None:
    from runstore.plugins.redis.cache import RedisHistoryCache
    from runstore.plugins.redis.streams import RedisStreamBridge

    url = _no_database_url(redis_url)
    shown = url.render(include_query=False)
    opened: list[Any] = []
    async with BackendOptions.scope(Settings()) as options:
        for kind, opener in (("redis stream bridge", RedisStreamBridge.open), ("redis history cache", RedisHistoryCache.open)):
            with pytest.raises(InvalidURLError) as info:
                opened.append(await opener(url, options))
            assert str(info.value).startswith(f"{kind} at {shown}: the server has no database 99999, which the URL path names")
            assert "0-15 by default" in str(info.value)
            assert "out of range" in str(info.value.__cause__)
    assert not opened


async def test_cache_on_an_unreachable_server_opens_and_misses() -> None:
    """The database check needs an answer; an unreachable server is the cache's usual miss."""
    from runstore.plugins.redis.cache import RedisHistoryCache

    url = BackendURL.parse(f"redis://127.0.0.1:{_closed_port()}/3")
    async with BackendOptions.scope(Settings()) as options:
        cache = await RedisHistoryCache.open(url, options)
        try:
            assert await cache.get("t", "k") is None
            assert cache.errors == 1
        finally:
            await cache.close()
