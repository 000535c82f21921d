"""Broken event store: an import renumbers the feed (each event appended at the next seq).

Gaps close and seqs shift, so cursors clients hold point elsewhere. The no-lock-in group
must fail it (contract: no lock-in: ... keeps its seqs ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class RenumberingImportStore(MemoryEventStore):
    async def aimport_events(self, records: Sequence[Mapping[str, Any]]) -> int:
        # BUG (on purpose): the records' seqs are ignored; put numbers them afresh.
        inserted = 0
        for record in records:
            await self.put(
                thread_id=record["thread_id"], run_id=record["run_id"], event_type=record["event_type"],
                category=record["category"], content=record["content"], metadata=record["metadata"],
                created_at=record["created_at"], user_id=None,
            )  # fmt: skip
            inserted += 1
        return inserted


async def _open(url: BackendURL, options: BackendOptions) -> RenumberingImportStore:
    return RenumberingImportStore()


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add("broken-import-renumbers", schemes=["broken-import-renumbers"], factory=_open,
                 capabilities=["bulk_import"])  # fmt: skip
