"""Where migrated records come from: a live backend (`LiveSource`) or an archive (`ArchiveSource`).

Both hand out the same streams: saver threads one at a time as `CheckpointRecord`
lists (parents first), and event threads as pages of records in seq order. A live
source reads through the public protocols; the archive reads its file front to back.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from runstore.checkpoint.modes import LEGACY_MODE_METADATA_KEY, MODE_METADATA_KEY
from runstore.migrate.endpoints import Endpoint
from runstore.migrate.records import CheckpointRecord

#: Events read or written per call.
EVENT_PAGE = 500


class LiveSource:
    """A backend read through its public protocols (savers) and ``bulk_import`` (events)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.label = endpoint.label

    @property
    def serde(self) -> Any:
        """The serde the saver records were produced with (their values load with it)."""
        return self.endpoint.saver.serde

    async def saver_threads(self, *, updated_after: datetime | None = None) -> AsyncIterator[tuple[str, list[CheckpointRecord]]]:
        """Each thread (written since ``updated_after`` where the saver can tell) with its records."""
        from runstore.migrate.savers import read_thread, thread_ids

        async for thread_id in thread_ids(self.endpoint.saver, updated_after=updated_after):
            yield thread_id, await read_thread(self.endpoint.saver, thread_id)

    async def has_delta_threads(self) -> bool:
        """Whether any checkpoint carries the delta-mode marker (one filtered listing per marker)."""
        saver = self.endpoint.saver
        for key in (MODE_METADATA_KEY, LEGACY_MODE_METADATA_KEY):
            # Closed at once: a stock saver holds its lock while a listing is open.
            async with contextlib.aclosing(saver.alist(None, filter={key: "delta"}, limit=1)) as found:
                async for _ in found:
                    return True
        return False

    async def run_threads(self) -> AsyncIterator[dict[str, Any]]:
        """Each thread's runs as stored (`SqlRunStore.aexport_runs`), threads ascending."""
        store = self.endpoint.runs
        after: str | None = None
        while True:
            threads = await store.aexport_run_thread_ids(after=after, limit=EVENT_PAGE)
            for thread_id in threads:
                yield await store.aexport_runs(thread_id)
            if len(threads) < EVENT_PAGE:
                return
            after = threads[-1]

    async def store_pages(self, skip: Any = None) -> AsyncIterator[tuple[tuple[str, ...], list[dict[str, Any]]]]:
        """``(namespace, page)``: each store namespace's live items in key order, namespaces
        ascending (`runstore.migrate.stores`); namespaces named in ``skip`` left out."""
        from runstore.migrate.stores import StoreSide, live_pages

        async for item in live_pages(StoreSide(self.endpoint.store), skip):
            yield item

    @property
    def store_bulk(self) -> bool:
        """Whether the source store keeps its items' TTL state (it declares ``bulk_import``)."""
        from runstore.store.bulk import BulkStore

        return isinstance(self.endpoint.store, BulkStore)

    async def event_pages(self, after: dict[str, int] | None = None) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        """``(thread_id, page)``: each thread's events above ``after[thread_id]`` in seq-ordered
        pages, a thread's pages contiguous, threads ascending."""
        store = self.endpoint.events
        seen = after or {}
        last: str | None = None
        while True:
            threads = await store.aexport_thread_ids(after=last, limit=EVENT_PAGE)
            for thread_id in threads:
                after_seq = seen.get(thread_id, 0)
                while True:
                    page = await store.aexport_events(thread_id, after_seq=after_seq, limit=EVENT_PAGE)
                    if page:
                        yield thread_id, [dict(record) for record in page]
                    if len(page) < EVENT_PAGE:
                        break
                    after_seq = page[-1]["seq"]
            if len(threads) < EVENT_PAGE:
                return
            last = threads[-1]
