"""Redis Cluster for the ``redis`` plugin: ``redis+cluster://host:port?nodes=host:port,...``.

`ClusterCalls` is `RedisCalls` with routing: each call goes to the master that owns
the hash slot of its key, and every rule of `RedisCalls` (time bounds, health checks,
retries only where nothing can be written twice, ``write_may_have_happened``) holds
per attempt. The slot map comes from ``CLUSTER SLOTS``, asked of any known node (the
URL's host and ``nodes`` are the seeds); it is read again before the next attempt
after a connection failure or a redirect, so a call that hits a master that died
retries until its replica has taken over, bounded by the operation deadline.

A redirect or refusal (``MOVED``, ``ASK``, ``CLUSTERDOWN``, ``TRYAGAIN``) means the
node did not run the command, so it is retried like a failure before sending, for
writes too. A slot being migrated (``ASK``) is waited out, not followed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from runstore.errors import InvalidURLError
from runstore.retry import BACKOFF, Deadline

from .client import RedisCalls, RedisTimeouts, _Failed, _Progress, open_pool

if TYPE_CHECKING:
    from runstore.urls import BackendURL

    from .settings import RedisSettings

SCHEMES = ("redis+cluster", "rediss+cluster")
#: URL options of cluster URLs on top of the single-server ones.
CLUSTER_OPTIONS = frozenset({"nodes"})
SLOTS = 16384
#: Error replies that say the node did not run the command.
_NOT_RUN = (b"MOVED", b"ASK", b"CLUSTERDOWN", b"TRYAGAIN")

Address = tuple[str, int]


def seed_nodes(url: BackendURL) -> list[Address]:
    """The URL's host:port followed by its ``nodes`` option (``host:port,host:port``)."""
    if url.host is None:
        raise InvalidURLError(
            f"{url}: a cluster URL needs one host, more seed nodes going in the nodes option: "
            "redis+cluster://host:port?nodes=host:port,host:port"
        )
    seeds: list[Address] = [(url.host, url.port or 6379)]
    for part in filter(None, (url.option("nodes") or "").split(",")):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidURLError(
                f"{url}: option nodes must list seed nodes as host:port,host:port; got {part!r}"
            )
        seeds.append((host.strip("[]"), int(port)))
    return seeds


def check_cluster_url(url: BackendURL) -> None:
    """Refuse what a cluster cannot serve: a database other than 0, a prefix with a hash tag."""
    if url.path.strip("/") not in ("", "0"):
        raise InvalidURLError(f"{url}: a Redis Cluster has only database 0; drop the path (got {url.path!r})")
    prefix = url.option("prefix") or ""
    if "{" in prefix or "}" in prefix:
        raise InvalidURLError(
            f"{url}: prefix {prefix!r} must not contain '{{' or '}}' on a cluster: runstore places "
            "its own hash tags in the keys, and a brace in the prefix would move them"
        )


def node_url(url: BackendURL, address: Address) -> BackendURL:
    """The single-server URL of one cluster node (same credentials, TLS and options)."""
    scheme = "rediss" if url.scheme.startswith("rediss") else "redis"
    return dataclasses.replace(url, scheme=scheme, host=address[0], port=address[1], path="")


def command_slot(command: Sequence[Any]) -> int | None:
    """The hash slot of a command's (first) key; ``None`` for a keyless command."""
    name = command[0].upper() if isinstance(command[0], str) else command[0].decode().upper()
    if name in ("EVAL", "EVALSHA"):
        key = command[3] if int(command[2]) > 0 else None
    elif name == "XREAD":
        words = [w.upper() if isinstance(w, str) else w for w in command]
        key = command[words.index("STREAMS") + 1]
    elif name in ("PING", "CLUSTER"):
        key = None
    else:
        key = command[1]
    if key is None:
        return None
    return int(key_slot(key if isinstance(key, bytes) else str(key).encode()))


def _not_run(reply: Any) -> bool:
    from redis.exceptions import ResponseError

    if not isinstance(reply, ResponseError):
        return False
    # redis-py turns some of these into their own classes; the message keeps the word.
    text = (type(reply).__name__.upper() + " " + str(reply)).encode()
    return any(word in text for word in _NOT_RUN)


class ClusterCalls(RedisCalls):
    """`RedisCalls` over a cluster: one pool per master, routed by the key's hash slot."""

    def __init__(
        self,
        make_pool: Callable[[Address], Any],
        seeds: Sequence[Address],
        timeouts: RedisTimeouts,
        *,
        backend: str,
        retry_backoff: Sequence[float] = BACKOFF,
    ) -> None:
        super().__init__(None, timeouts, backend=backend, retry_backoff=retry_backoff)
        self._make_pool = make_pool
        self.seeds = list(seeds)
        self.pools: dict[Address, Any] = {}
        self._owners: list[Address | None] | None = None  # master of each slot; None: read it again
        self._known: list[Address] = list(seeds)  # every node the last map named, then the seeds
        self._refresh_lock = asyncio.Lock()

    @classmethod
    def for_url(cls, url: BackendURL, settings: RedisSettings, timeouts: RedisTimeouts, *, backend: str,
                runstore_options: Sequence[str]) -> ClusterCalls:
        """Calls for a ``redis+cluster://`` URL; pools open lazily, per master."""
        check_cluster_url(url)
        seeds = seed_nodes(url)

        def make_pool(address: Address) -> Any:
            return open_pool(node_url(url, address), settings, timeouts,
                             runstore_options=(*runstore_options, *CLUSTER_OPTIONS))

        calls = cls(make_pool, seeds, timeouts, backend=backend)
        calls._pool(seeds[0])  # a bad TLS option fails here, at open, not at the first call
        return calls

    def _pool(self, address: Address) -> Any:
        pool = self.pools.get(address)
        if pool is None:
            pool = self.pools[address] = self._make_pool(address)
        return pool

    async def _attempt(
        self, commands: Sequence[Sequence[Any]], read_timeout: float | None, progress: _Progress,
        deadline: Deadline,
    ) -> list[Any]:
        slots = {slot for slot in map(command_slot, commands) if slot is not None}
        if len(slots) > 1:
            raise ValueError(f"{self.backend}: one call must stay in one hash slot (got slots {sorted(slots)})")
        if self._owners is None:
            await self._refresh(deadline)
        owners = self._owners or []
        address = owners[slots.pop()] if slots else (next(filter(None, owners), None) or self.seeds[0])
        if address is None:
            from redis.exceptions import ConnectionError as RedisConnectionError

            self._owners = None
            cause = RedisConnectionError("the cluster names no master for this key's slot")
            raise _Failed(cause, sent=False, replies=[])
        try:
            replies = await self._attempt_on(self._pool(address), commands, read_timeout, progress, deadline)
        except _Failed:
            self._owners = None  # the master may have died: ask for the slot map again
            raise
        refused = [i for i, reply in enumerate(replies) if _not_run(reply)]
        if refused:
            self._owners = None
            cause = replies[refused[0]]
            # Commands before the first refusal ran; a pipeline is all in one slot, so
            # normally all or none are refused.
            raise _Failed(cause, sent=refused[0] > 0, replies=replies[: refused[0]])
        return replies

    async def _refresh(self, deadline: Deadline) -> None:
        """Read the slot map from the first node that answers ``CLUSTER SLOTS``."""
        async with self._refresh_lock:
            if self._owners is not None:
                return
            failure: _Failed | None = None
            for address in dict.fromkeys([*self._known, *self.seeds]):
                try:
                    (reply,) = await self._attempt_on(
                        self._pool(address), [("CLUSTER", "SLOTS")], None, _Progress(), deadline
                    )
                except _Failed as failed:
                    failure = failed
                    continue
                if isinstance(reply, Exception):
                    if "cluster support disabled" in str(reply):
                        raise InvalidURLError(
                            f"{self.backend}: {address[0]}:{address[1]} is not a cluster node ({reply}); "
                            "use redis:// for a single server"
                        ) from reply
                    failure = _Failed(reply, sent=False, replies=[])
                    continue
                self._owners, self._known = self._parse(reply, address[0])
                return
            assert failure is not None
            raise _Failed(failure.cause, sent=False, replies=[])

    @staticmethod
    def _parse(reply: Sequence[Any], asked: str) -> tuple[list[Address | None], list[Address]]:
        owners: list[Address | None] = [None] * SLOTS
        known: dict[Address, None] = {}
        for start, end, master, *replicas in reply:
            nodes = []
            for node in (master, *replicas):
                host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
                nodes.append((host or asked, int(node[1])))  # an empty host: the node we asked
            known.update(dict.fromkeys(nodes))
            for slot in range(int(start), int(end) + 1):
                owners[slot] = nodes[0]
        return owners, list(known)

    async def close(self) -> None:
        """Close every connection of every node's pool."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        await asyncio.gather(*(pool.disconnect() for pool in self.pools.values()), return_exceptions=True)


def open_cluster_client(url: BackendURL, settings: RedisSettings, timeouts: RedisTimeouts | None = None) -> Any:
    """A redis-py ``RedisCluster`` for ``url`` (the history cache and test clean-up use it)
    with runstore's time bounds, TLS options and pool size per node."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from .client import tls_arguments

    check_cluster_url(url)
    timeouts = timeouts or RedisTimeouts.resolve(url, settings)
    plain = node_url(url, seed_nodes(url)[0])
    tls = tls_arguments(plain, settings)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in seed_nodes(url)],
        username=url.username or None,
        password=url.password,
        ssl=bool(tls),
        **tls,
        max_connections=settings.max_connections,
        socket_connect_timeout=timeouts.socket_connect_timeout,
        socket_timeout=timeouts.socket_timeout,
        protocol=2,
    )
