"""Broken fenced event store: ``put`` checks the token, yields, then appends.

A newer token's append can land in between, and the stale append lands after it. The
event fencing suite must fail it (contract: no append carrying a stale token lands
after a newer token was written).
"""

from __future__ import annotations

import asyncio
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class CheckThenAppendStore(MemoryEventStore):
    async def put(self, *, fence: int | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        if fence is not None:
            self._fence([kwargs["thread_id"]], fence)
            # BUG (on purpose): the append happens in a later step than the check.
            await asyncio.sleep(0)
        return await super().put(**kwargs)


async def _open(url: BackendURL, options: BackendOptions) -> CheckThenAppendStore:
    return await CheckThenAppendStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "broken-fence-check-then-append", schemes=["broken-fence-check-then-append"],
        factory=_open, capabilities=["fencing"],
    )  # fmt: skip
