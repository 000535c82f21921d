"""Broken event store: ``put_batch`` writes event by event, so a bad event leaves a prefix.

The event suite must fail it (contract: put_batch is all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runstore.events.owner import AUTO, UserId
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class PrefixBatchStore(MemoryEventStore):
    async def put_batch(  # type: ignore[override]
        self, events: Sequence[Mapping[str, Any]], *, user_id: UserId = AUTO
    ) -> list[Any]:
        # BUG (on purpose): each event is validated and written on its own.
        return [await self.put(**event, user_id=user_id) for event in events]


async def _open(url: BackendURL, options: BackendOptions) -> PrefixBatchStore:
    return await PrefixBatchStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add("broken-batch-prefix", schemes=["broken-batch-prefix"], factory=_open)
