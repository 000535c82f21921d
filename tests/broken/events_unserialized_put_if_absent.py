"""Broken event store: ``put_if_absent`` checks, yields, then writes (no serialization).

Racing callers all see "absent" and all create. The event suite must fail it
(contract: put_if_absent is serialized).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from runstore.events.owner import AUTO, UserId
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class UnserializedStore(MemoryEventStore):
    async def put_if_absent(  # type: ignore[override]
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: Any = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> tuple[Any, bool]:
        existing = await self.list_events(
            thread_id, run_id, event_types=[event_type], limit=1, user_id=user_id
        )
        if existing:
            return existing[0], False
        # BUG (on purpose): another writer can run between the check and the write.
        await asyncio.sleep(0)
        record = await self.put(
            thread_id=thread_id, run_id=run_id, event_type=event_type, category=category,
            content=content, metadata=metadata, created_at=created_at, user_id=user_id,
        )
        return record, True


async def _open(url: BackendURL, options: BackendOptions) -> UnserializedStore:
    return await UnserializedStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add("broken-unserialized", schemes=["broken-unserialized"], factory=_open)
