"""Broken event store: ``before_seq`` is inclusive (returns the cursor row again).

The event suite must fail it (contract: before_seq is exclusive).
"""

from __future__ import annotations

from runstore.events.owner import AUTO, UserId
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class InclusiveCursorStore(MemoryEventStore):
    async def list_messages(  # type: ignore[override]
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list:
        # BUG (on purpose): "below the cursor" includes the cursor itself.
        if before_seq is not None:
            before_seq += 1
        return await super().list_messages(
            thread_id, limit=limit, before_seq=before_seq, after_seq=after_seq, user_id=user_id
        )


async def _open(url: BackendURL, options: BackendOptions) -> InclusiveCursorStore:
    return await InclusiveCursorStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add("broken-inclusive-cursor", schemes=["broken-inclusive-cursor"], factory=_open)
