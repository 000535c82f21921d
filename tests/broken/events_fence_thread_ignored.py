"""Broken fenced event store: fenced appends are checked, but ``fence_thread`` (what a
lease grant calls) is the protocol's no-op, so after a takeover the stale worker's
appends are accepted until the new holder writes its first event.

The event fencing suite must fail it (contract: an append carrying a stale token after
fence_thread with a newer token is refused).
"""

from __future__ import annotations

from runstore.events.protocol import RunEventStore
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class FenceThreadIgnored(MemoryEventStore):
    # BUG (on purpose): the grant's fence is checked for shape and then dropped.
    fence_thread = RunEventStore.fence_thread


async def _open(url: BackendURL, options: BackendOptions) -> FenceThreadIgnored:
    return await FenceThreadIgnored.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "broken-fence-thread-ignored", schemes=["broken-fence-thread-ignored"],
        factory=_open, capabilities=["fencing"],
    )  # fmt: skip
