"""Delta-history cache in Redis (``checkpoint_cache.type: redis``).

One hash per thread, ``{prefix}{key_prefix}{thread_id}``, with a field per entry and
a TTL of ``checkpoint_cache.ttl_seconds`` refreshed on every write; purging a thread
deletes its hash. Values are the saver's own serializer output. Any Redis error
(connection refused, timeout, a bad value) is a miss or a skipped write, never an
exception and never a wrong answer; only opening refuses something, a database the
server does not have. Calls are bounded by the ``redis`` timeouts (and the URL
options of the same names); after a connection failure the cache answers
misses without touching Redis for `RETRY_AFTER` seconds, so an unresponsive server
costs one bounded wait, not one per checkpoint read.

On a Redis Cluster (``redis+cluster://``) the client is redis-py's ``RedisCluster``:
every command touches one thread's hash, so it routes each to the slot's master and
follows redirects and failovers itself (its own few retries; all of the cache's
writes are idempotent). ``clear`` scans every master.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from runstore.urls import BackendURL

if TYPE_CHECKING:
    from langgraph.checkpoint.base import DeltaChannelHistory, SerializerProtocol

    from runstore.options import BackendOptions

    from .client import RedisTimeouts

log = logging.getLogger("runstore.plugins.redis.cache")

BACKEND = "redis history cache"

DEFAULT_KEY_PREFIX = "runstore:history:"
#: Seconds of misses without I/O after a connection failure, before Redis is tried again.
RETRY_AFTER = 1.0
_SEP = b"\x00"


class RedisHistoryCache:
    """History entries in Redis hashes; failures degrade to misses."""

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "",
        key_prefix: str | None = None,
        ttl_seconds: int = 86400,
        serde: SerializerProtocol | None = None,
    ) -> None:
        self.client = client
        self.prefix = f"{prefix}{key_prefix if key_prefix is not None else DEFAULT_KEY_PREFIX}"
        self.ttl_seconds = max(1, int(ttl_seconds))
        self._serde = serde
        self.errors = 0
        self._skip_until = 0.0  # monotonic time before which calls are misses without I/O

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> RedisHistoryCache:
        """Open from ``redis://host:port/db?prefix=P`` and the ``checkpoint_cache`` settings.

        An unreachable server shows up as misses, not here. A database other than 0 is
        checked here, within the connect and reply timeouts: one the server does not
        have is `InvalidURLError`, as for the stream bridge (every later call would be a
        miss). The timeouts come from the ``redis`` settings and the URL options of the
        same names.
        """
        import redis.asyncio as aioredis

        from .client import TIMEOUT_OPTIONS, URL_OPTIONS, RedisTimeouts, open_pool
        from .settings import RedisSettings

        settings = options.settings
        if url.scheme.endswith("+cluster"):
            from .cluster import CLUSTER_OPTIONS, open_cluster_client

            # Every command touches one thread's hash, so redis-py's cluster client routes it.
            url.check_options(URL_OPTIONS | CLUSTER_OPTIONS)
            client = open_cluster_client(url, settings.section(RedisSettings))
        else:
            url.check_options(URL_OPTIONS)
            timeouts = RedisTimeouts.resolve(url, settings.section(RedisSettings))
            pool = open_pool(url, settings.section(RedisSettings), timeouts,
                             runstore_options=("prefix", *TIMEOUT_OPTIONS))
            client = aioredis.Redis(connection_pool=pool)
            await _refuse_missing_database(client, url, timeouts)
        cache = cls(
            client,
            prefix=url.option("prefix", "") or "",
            key_prefix=settings.checkpoint_cache.key_prefix,
            ttl_seconds=settings.checkpoint_cache.ttl_seconds,
        )
        return cache

    def bind_serde(self, serde: SerializerProtocol) -> None:
        """Serialize entries with the wrapped saver's serializer."""
        self._serde = serde

    def _serializer(self) -> SerializerProtocol:
        if self._serde is None:
            from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

            self._serde = JsonPlusSerializer()
        return self._serde

    def _key(self, thread_id: str) -> str:
        return f"{self.prefix}{thread_id}"

    def _encode(self, entry: DeltaChannelHistory) -> bytes:
        payload: dict[str, Any] = {"w": [list(w) for w in entry["writes"]]}
        if "seed" in entry:
            payload["s"] = entry["seed"]
        if "seed_ref" in entry:
            payload["r"] = entry["seed_ref"]  # type: ignore[typeddict-item]
        type_, data = self._serializer().dumps_typed(payload)
        return type_.encode() + _SEP + data

    def _decode(self, raw: bytes) -> DeltaChannelHistory:
        type_, _, data = raw.partition(_SEP)
        payload = self._serializer().loads_typed((type_.decode(), data))
        entry: DeltaChannelHistory = {"writes": [tuple(w) for w in payload["w"]]}
        if "s" in payload:
            entry["seed"] = payload["s"]
        if "r" in payload:
            entry["seed_ref"] = payload["r"]  # type: ignore[typeddict-unknown-key]
        return entry

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        from .client import connection_errors

        if isinstance(exc, connection_errors()):
            self._skip_until = time.monotonic() + RETRY_AFTER
        # The exception text may carry connection details; log only its type.
        log.debug("redis history cache %s failed (%s); degrading to a miss", op, type(exc).__name__)

    def _skipping(self) -> bool:
        """Whether Redis failed moments ago: answer without I/O until `RETRY_AFTER` passed."""
        return time.monotonic() < self._skip_until

    async def get(self, thread_id: str, key: str) -> DeltaChannelHistory | None:
        if self._skipping():
            return None
        try:
            raw = await self.client.hget(self._key(thread_id), key)
            if raw is None:
                return None
            return self._decode(raw)
        except Exception as exc:
            self._failed("get", exc)
            return None

    async def set(self, thread_id: str, key: str, entry: DeltaChannelHistory) -> None:
        if self._skipping():
            return
        try:
            raw = self._encode(entry)
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(self._key(thread_id), key, raw)
                pipe.expire(self._key(thread_id), self.ttl_seconds)
                await pipe.execute()
        except Exception as exc:
            self._failed("set", exc)

    async def purge_thread(self, thread_id: str) -> None:
        try:
            await self.client.delete(self._key(thread_id))
        except Exception as exc:
            self._failed("purge", exc)

    async def clear(self) -> None:
        try:
            pattern = self.prefix.replace("\\", "\\\\")
            for ch in "*?[]":
                pattern = pattern.replace(ch, "\\" + ch)
            keys = [k async for k in self.client.scan_iter(match=pattern + "*", count=500)]
            if keys:
                await self.client.delete(*keys)
        except Exception as exc:
            self._failed("clear", exc)

    async def close(self) -> None:
        from redis.asyncio.cluster import RedisCluster

        try:
            if isinstance(self.client, RedisCluster):
                await self.client.aclose()  # closes every node's connections
            else:
                await self.client.aclose(close_connection_pool=True)
        except Exception as exc:
            self._failed("close", exc)


async def _refuse_missing_database(client: Any, url: BackendURL, timeouts: RedisTimeouts) -> None:
    """Raise `InvalidURLError` if the server refuses the URL's database (a number other than 0,
    which every server has); an unreachable server is left to show as misses."""
    from redis.exceptions import ResponseError

    from .client import backend_name, connection_errors, database_number, no_database_error

    database = database_number(url)
    if not database:
        return
    try:
        async with asyncio.timeout(timeouts.socket_connect_timeout + timeouts.socket_timeout):
            await client.ping()
    except ResponseError as exc:
        await client.aclose(close_connection_pool=True)
        raise no_database_error(backend_name(BACKEND, url), database, exc) from exc
    except connection_errors():  # asyncio's timeout among them
        pass
