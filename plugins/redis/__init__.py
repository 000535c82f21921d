"""Built-in plugin ``redis``: stream bridge on Redis Streams and a delta-history cache.

``redis://host:6379/0?prefix=app:`` (``rediss://`` for TLS); the optional ``prefix``
namespaces every key, and the timeout options (``socket_timeout``, ...; see
`runstore.plugins.redis.client`) override the ``redis`` settings. A Redis Cluster is
``redis+cluster://host:port?nodes=host:port,host:port`` (``rediss+cluster://`` for TLS;
the host and ``nodes`` are seed nodes). Needs ``runstore[redis]``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runstore.hookspecs import hookimpl
from runstore.urls import BackendURL

from .settings import RedisSettings

if TYPE_CHECKING:
    from runstore.registry import HistoryCacheRegistry, SettingsRegistry, StreamBridgeRegistry

SCHEMES = ["redis", "rediss"]
CLUSTER_SCHEMES = ["redis+cluster", "rediss+cluster"]
DRIVERS = ["redis"]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add(
        "redis",
        schemes=SCHEMES,
        factory="runstore.plugins.redis.streams:RedisStreamBridge.open",
        capabilities=["cross_process", "replay", "fencing"],
        drivers=DRIVERS,
        extra="redis",
        description="Redis Streams bridge: redis://host:6379/0",
    )
    registry.add(
        "redis-cluster",
        schemes=CLUSTER_SCHEMES,
        factory="runstore.plugins.redis.cluster_streams:RedisClusterStreamBridge.open",
        capabilities=["cross_process", "replay", "fencing"],
        drivers=DRIVERS,
        extra="redis",
        description="Redis Streams bridge on a Redis Cluster: redis+cluster://host:port?nodes=host:port,...",
    )


@hookimpl
def runstore_register_history_caches(registry: HistoryCacheRegistry) -> None:
    registry.add(
        "redis",
        schemes=SCHEMES,
        factory="runstore.plugins.redis.cache:RedisHistoryCache.open",
        capabilities=["cross_process"],
        drivers=DRIVERS,
        extra="redis",
        description="delta-history cache in Redis",
    )
    registry.add(
        "redis-cluster",
        schemes=CLUSTER_SCHEMES,
        factory="runstore.plugins.redis.cache:RedisHistoryCache.open",
        capabilities=["cross_process"],
        drivers=DRIVERS,
        extra="redis",
        description="delta-history cache in a Redis Cluster",
    )


@hookimpl
def runstore_register_settings(registry: SettingsRegistry) -> None:
    registry.add("redis", RedisSettings, description="client pool and time bounds of the Redis backends")


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme in CLUSTER_SCHEMES:
        return _cluster_scratch(url)
    if url.scheme not in SCHEMES:
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        import redis.asyncio as aioredis
        from redis.exceptions import ConnectionError as RedisConnectionError

        from .client import URL_OPTIONS, tls_arguments

        # Before connecting: a misspelled option would reach redis-py as a keyword argument.
        url.check_options(URL_OPTIONS)
        prefix = f"{url.option('prefix', '')}runstore-conf-{uuid.uuid4().hex[:12]}:"
        client = aioredis.Redis.from_url(
            url.without_query(*URL_OPTIONS).render(hide_password=False),
            **tls_arguments(url, RedisSettings()),
        )
        try:
            try:
                await client.ping()
            except RedisConnectionError as exc:
                # The harness turns a builtin ConnectionError into "service unreachable".
                raise ConnectionError(str(exc)) from exc
            try:
                yield url.with_query(prefix=prefix)
            finally:
                keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=500)]
                if keys:
                    await client.delete(*keys)
        finally:
            await client.aclose()

    return scratch()


@contextlib.asynccontextmanager
async def _cluster_scratch(url: BackendURL) -> AsyncIterator[BackendURL]:
    """A fresh ``prefix`` on a cluster; its keys are deleted from every master afterwards."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException

    from .cluster import open_cluster_client

    prefix = f"{url.option('prefix', '')}runstore-conf-{uuid.uuid4().hex[:12]}:"
    try:
        client = open_cluster_client(url, RedisSettings())
        await client.initialize()
    except (RedisConnectionError, RedisClusterException) as exc:
        # The harness turns a builtin ConnectionError into "service unreachable".
        raise ConnectionError(str(exc)) from exc
    try:
        yield url.with_query(prefix=prefix)
    finally:
        try:
            keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=500)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
