"""Broken event stores, each breaking one rule the way a careful author might. The event
store suite must fail each by the rule's name:

- ``broken-events-prefix-delete``: ``delete_by_thread("t1")`` also deletes ``t10``'s
  events (a prefix match);
- ``broken-owner-list-runs``: ``list_runs`` (a later addition) forgets the owner filter
  every other read applies.
"""

from __future__ import annotations

from runstore.events.owner import AUTO, UserId
from runstore.events.protocol import RunSummary
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.plugins.sqlite.events import SqliteEventStore
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL


class PrefixDeleteStore(MemoryEventStore):
    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        deleted = await super().delete_by_thread(thread_id, user_id=user_id)
        # BUG (on purpose): WHERE thread_id LIKE :thread_id || '%'.
        for other in [t for t in self._threads if t.startswith(thread_id)]:
            deleted += await super().delete_by_thread(other, user_id=user_id)
        return deleted


class OwnerBlindRunsStore(SqliteEventStore):
    async def list_runs(self, thread_id: str, *, user_id: UserId = AUTO) -> list[RunSummary]:
        self._target_call(thread_id, None, user_id)  # the owner is resolved ...
        # BUG (on purpose): ... and then not filtered on.
        return await super().list_runs(thread_id, user_id=None)


async def _prefix(url: BackendURL, options: BackendOptions) -> PrefixDeleteStore:
    return await PrefixDeleteStore.open(url.with_query(), options)  # type: ignore[return-value]


async def _owner(url: BackendURL, options: BackendOptions) -> OwnerBlindRunsStore:
    sqlite_url = BackendURL.for_file("sqlite", url.file_path() or "events.db")
    return await OwnerBlindRunsStore.open(sqlite_url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add("broken-events-prefix-delete", schemes=["broken-events-prefix-delete"], factory=_prefix,
                 capabilities=["fencing"])
    registry.add("broken-owner-list-runs", schemes=["broken-owner-list-runs"], factory=_owner,
                 capabilities=["durable", "cross_process", "owner_filter", "fencing"])


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> object:
    if url.scheme != "broken-owner-list-runs":
        return None
    import contextlib
    import tempfile
    from collections.abc import AsyncIterator
    from pathlib import Path

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        with tempfile.TemporaryDirectory(prefix="runstore-broken-") as tmp:
            yield BackendURL.for_file(url.scheme, Path(tmp, "events.db"))

    return scratch()
