"""Stream bridge on a Redis Cluster: ``redis+cluster://host:port?nodes=host:port,...&prefix=app:``.

The single-server bridge, with keys and readers laid out for hash slots. Every
command on a run's stream touches that one key, so those work on a cluster as they
are; the one multi-key command is the waker's blocking ``XREAD``, which a cluster
only accepts when all its keys share a hash slot. So runs are spread over
`SLOT_GROUPS` slot groups: a run's key carries the hash tag of its group
(``<prefix>stream:{rs3.12}<run_id>``), each bridge runs one waker per group it
follows, and each waker has its own control stream tagged like its group
(``<prefix>ctl:{rs3.12}<uuid>``). A bridge therefore blocks at most `SLOT_GROUPS`
connections however many runs it follows; the groups' slots are spread evenly over
the slot range, so a cluster whose masters own equal slot ranges (what
``redis-cli --cluster create`` makes) shares the readers and the streams evenly.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from runstore.batching import Outcome
from runstore.errors import ConfigError
from runstore.streams.protocol import check_run_id

from .client import TIMEOUT_OPTIONS, URL_OPTIONS, RedisTimeouts, backend_name
from .cluster import CLUSTER_OPTIONS, SLOTS, ClusterCalls
from .scripts import Call
from .settings import RedisSettings
from .streams import BACKEND, RedisStreamBridge

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

#: How many slot groups runs are spread over. Part of the key layout: every process of a
#: deployment must use the same value, so it is fixed.
SLOT_GROUPS = 16


def group_tags(count: int = SLOT_GROUPS) -> list[str]:
    """One hash tag per group; group ``k``'s slot lies in the ``k``-th of ``count`` equal slot ranges."""
    tags = []
    for group in range(count):
        n = 0
        while key_slot(f"rs{group}.{n}".encode()) * count // SLOTS != group:
            n += 1
        tags.append(f"rs{group}.{n}")
    return tags


TAGS = group_tags()
_GROUP_OF_SLOT = {int(key_slot(tag.encode())): group for group, tag in enumerate(TAGS)}


class RedisClusterStreamBridge(RedisStreamBridge):
    """`RedisStreamBridge` on a Redis Cluster: runs in slot groups, one waker per group.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.redis.cluster_streams import RedisClusterStreamBridge


    async def main() -> None:
        async with RedisClusterStreamBridge.from_conn_string("redis+cluster://localhost:7000?nodes=localhost:7001&prefix=app:") as bridge:
            await bridge.publish("run-1", "values", {"count": 1})
            await bridge.publish_end("run-1")
            async for item in bridge.subscribe("run-1"):  # replays, then follows until END
                print(item)  # StreamEvent(id='0-1', event='values', data={'count': 1}), then END


    asyncio.run(main())
    ```
    """

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> RedisClusterStreamBridge:
        """Open lazily pooled clients per master (each at most ``redis.max_connections``) and
        check the cluster answers; URL options as for ``redis://`` plus ``nodes`` (more seeds)."""
        url.check_options(URL_OPTIONS | CLUSTER_OPTIONS)
        section = options.settings.section(RedisSettings)
        if section.max_connections <= SLOT_GROUPS:
            raise ConfigError(
                f"redis.max_connections must be > {SLOT_GROUPS} for the redis cluster stream bridge "
                f"(up to {SLOT_GROUPS} connections of one master may be blocking readers)"
            )
        timeouts = RedisTimeouts.resolve(url, section)
        calls = ClusterCalls.for_url(url, section, timeouts, backend=backend_name(BACKEND, url),
                                     runstore_options=("prefix", *TIMEOUT_OPTIONS))
        bridge = await cls._opened(calls, url, options)
        assert isinstance(bridge, cls)
        return bridge

    def key(self, run_id: str) -> bytes:
        """The key of a run's stream, hash-tagged with the run's slot group."""
        run_id = check_run_id(run_id)
        group = zlib.crc32(run_id.encode()) % SLOT_GROUPS
        return f"{self.prefix}stream:{{{TAGS[group]}}}{run_id}".encode()

    def _group(self, key: bytes) -> Any:
        return _GROUP_OF_SLOT[int(key_slot(key))]

    def _control_key(self, group: Any) -> bytes:
        return f"{self.prefix}ctl:{{{TAGS[group]}}}{self._control.decode().rpartition(':')[2]}".encode()

    async def _send_batch(self, batch: list[Call]) -> list[Outcome]:
        """One pipeline per slot group (a pipeline goes to one node), sent concurrently;
        the outcomes in the batch's order."""
        groups: dict[Any, list[int]] = {}
        for i, item in enumerate(batch):
            groups.setdefault(self._group(item.key), []).append(i)
        if len(groups) == 1:
            return await RedisStreamBridge._send_batch(self, batch)
        sent = await asyncio.gather(
            *(RedisStreamBridge._send_batch(self, [batch[i] for i in members]) for members in groups.values())
        )
        outcomes: dict[int, Outcome] = {}
        for members, answers in zip(groups.values(), sent, strict=True):
            outcomes.update(zip(members, answers, strict=True))
        return [outcomes[i] for i in range(len(batch))]
