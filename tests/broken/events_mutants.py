"""Broken event stores, one realistic bug each, for the event suite's teeth tests.

Each class subclasses the correct `MemoryEventStore` and breaks one rule of
docs/events.md (the docstring names it). The plugin registers every class under
``mut-events-<name>://``; `tests/test_events_teeth.py` requires the named failure
for each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runstore.events.owner import AUTO, UserId
from runstore.events.protocol import EventRecord, RunEventStore
from runstore.events.records import PreparedEvent, copy_record, is_visible_ai_message
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore, _Rows, _Thread
from runstore.registry import EventStoreRegistry
from runstore.urls import BackendURL

MUTANTS: dict[str, type[MemoryEventStore]] = {}


def mutant(name: str) -> Any:
    """Register a broken store class as ``mut-events-<name>``."""

    def register(cls: type[MemoryEventStore]) -> type[MemoryEventStore]:
        MUTANTS[f"mut-events-{name}"] = cls
        return cls

    return register


# --------------------------------------------------------------------------- paging


@mutant("by-run-after-inclusive")
class ByRunAfterInclusive(MemoryEventStore):
    """list_messages_by_run treats ``after_seq`` as inclusive."""

    async def list_messages_by_run(self, thread_id: str, run_id: str, *, limit: int = 500,
                                   after_seq: int | None = None, before_seq: int | None = None,
                                   user_id: UserId = AUTO) -> list[EventRecord]:
        if after_seq is not None:
            after_seq -= 1
        return await super().list_messages_by_run(
            thread_id, run_id, limit=limit, after_seq=after_seq, before_seq=before_seq, user_id=user_id
        )


@mutant("by-run-ignores-before")
class ByRunIgnoresBefore(MemoryEventStore):
    """list_messages_by_run ignores ``before_seq``."""

    async def list_messages_by_run(self, thread_id: str, run_id: str, *, limit: int = 500,
                                   after_seq: int | None = None, before_seq: int | None = None,
                                   user_id: UserId = AUTO) -> list[EventRecord]:
        return await super().list_messages_by_run(
            thread_id, run_id, limit=limit, after_seq=after_seq, user_id=user_id
        )


@mutant("after-inclusive")
class AfterInclusive(MemoryEventStore):
    """list_messages treats ``after_seq`` as inclusive."""

    async def list_messages(self, thread_id: str, *, limit: int = 50, before_seq: int | None = None,
                            after_seq: int | None = None, user_id: UserId = AUTO) -> list[EventRecord]:
        if after_seq is not None:
            after_seq -= 1
        return await super().list_messages(
            thread_id, limit=limit, before_seq=before_seq, after_seq=after_seq, user_id=user_id
        )


class _PagingBug(MemoryEventStore):
    """Message pages go through `page`, which a subclass breaks."""

    def page(self, rows: _Rows, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        return rows.page(limit, before, after)

    async def list_messages(self, thread_id: str, *, limit: int = 50, before_seq: int | None = None,
                            after_seq: int | None = None, user_id: UserId = AUTO) -> list[EventRecord]:
        await super().list_messages(thread_id, limit=limit, before_seq=before_seq, after_seq=after_seq,
                                    user_id=user_id)  # validates the arguments as usual
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        return [copy_record(r) for r in self.page(thread.messages, limit, before_seq, after_seq)]


@mutant("both-cursors-last-page")
class BothCursorsLastPage(_PagingBug):
    """With both cursors, returns the last ``limit`` of the window instead of the first."""

    def page(self, rows: _Rows, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        if before is not None and after is not None and limit > 0:
            window = [r for r in rows.rows if after < r["seq"] < before]
            return window[-limit:]
        return rows.page(limit, before, after)


@mutant("no-cursor-oldest")
class NoCursorOldest(_PagingBug):
    """Without a cursor, returns the oldest ``limit`` messages instead of the newest."""

    def page(self, rows: _Rows, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        if before is None and after is None:
            return rows.rows[:limit] if limit > 0 else []
        return rows.page(limit, before, after)


@mutant("before-ignores-limit")
class BeforeIgnoresLimit(_PagingBug):
    """With ``before_seq`` only, the whole window below the cursor comes back."""

    def page(self, rows: _Rows, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        if before is not None and after is None and limit > 0:
            return rows.page(10**9, before, after)
        return rows.page(limit, before, after)


@mutant("pages-descending")
class PagesDescending(_PagingBug):
    """Message pages come back newest first."""

    def page(self, rows: _Rows, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        return list(reversed(rows.page(limit, before, after)))


@mutant("list-events-ignores-limit")
class ListEventsIgnoresLimit(MemoryEventStore):
    """list_events ignores ``limit``."""

    async def list_events(self, thread_id: str, run_id: str, *, event_types: Sequence[str] | None = None,
                          task_id: str | None = None, limit: int = 500, after_seq: int | None = None,
                          user_id: UserId = AUTO) -> list[EventRecord]:
        return await super().list_events(
            thread_id, run_id, event_types=event_types, task_id=task_id,
            limit=10**9 if limit > 0 else limit, after_seq=after_seq, user_id=user_id,
        )


@mutant("list-events-limit-before-filter")
class ListEventsLimitBeforeFilter(MemoryEventStore):
    """list_events takes the first ``limit`` events, then applies the type/task filters."""

    async def list_events(self, thread_id: str, run_id: str, *, event_types: Sequence[str] | None = None,
                          task_id: str | None = None, limit: int = 500, after_seq: int | None = None,
                          user_id: UserId = AUTO) -> list[EventRecord]:
        # The filters are validated as usual (limit=0 reads nothing).
        await super().list_events(thread_id, run_id, event_types=event_types, task_id=task_id,
                                  limit=0, user_id=user_id)
        rows = await super().list_events(thread_id, run_id, limit=limit, after_seq=after_seq, user_id=user_id)
        if event_types is not None:
            rows = [r for r in rows if r["event_type"] in set(event_types)]
        if task_id is not None:
            rows = [r for r in rows if r["metadata"].get("task_id") == task_id]
        return rows


@mutant("list-events-after-inclusive")
class ListEventsAfterInclusive(MemoryEventStore):
    """list_events treats ``after_seq`` as inclusive."""

    async def list_events(self, thread_id: str, run_id: str, *, event_types: Sequence[str] | None = None,
                          task_id: str | None = None, limit: int = 500, after_seq: int | None = None,
                          user_id: UserId = AUTO) -> list[EventRecord]:
        return await super().list_events(
            thread_id, run_id, event_types=event_types, task_id=task_id, limit=limit,
            after_seq=None if after_seq is None else after_seq - 1, user_id=user_id,
        )


@mutant("list-events-task-ignored")
class ListEventsTaskIgnored(MemoryEventStore):
    """list_events ignores ``task_id``."""

    async def list_events(self, thread_id: str, run_id: str, *, event_types: Sequence[str] | None = None,
                          task_id: str | None = None, limit: int = 500, after_seq: int | None = None,
                          user_id: UserId = AUTO) -> list[EventRecord]:
        return await super().list_events(
            thread_id, run_id, event_types=event_types, limit=limit, after_seq=after_seq, user_id=user_id
        )


@mutant("count-all-categories")
class CountAllCategories(MemoryEventStore):
    """count_messages counts every event of the thread, not only messages."""

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        await super().count_messages(thread_id, user_id=user_id)
        thread = self._threads.get(thread_id)
        return sum(len(rows) for rows in thread.runs.values()) if thread else 0


# --------------------------------------------------------------------------- lookups


@mutant("find-latest-oldest")
class FindLatestKeepsOldest(MemoryEventStore):
    """find_latest_ai_message_run_ids walks forward and keeps the first (oldest) match."""

    async def find_latest_ai_message_run_ids(self, thread_id: str, message_ids: Iterable[str], *,
                                             user_id: UserId = AUTO) -> dict[str, str]:
        from runstore.events.records import ai_message_match, normalize_message_ids

        pending = normalize_message_ids(message_ids)
        result: dict[str, str] = {}
        if not pending:
            return result
        after = 0
        while pending:
            page = await self.list_messages(thread_id, limit=1000, after_seq=after, user_id=user_id)
            if not page:
                break
            for event in page:
                match = ai_message_match(event, pending)
                if match is not None:
                    result[match[0]] = match[1]
                    pending.discard(match[0])
            after = page[-1]["seq"]
        return result


@mutant("find-latest-any-type")
class FindLatestAnyMessageType(MemoryEventStore):
    """find_latest_ai_message_run_ids matches any message with the id, not only AI ones."""

    async def find_latest_ai_message_run_ids(self, thread_id: str, message_ids: Iterable[str], *,
                                             user_id: UserId = AUTO) -> dict[str, str]:
        wanted = set(message_ids)
        if not wanted:
            return {}
        result: dict[str, str] = {}
        for event in await self.list_messages(thread_id, limit=10**9, user_id=user_id):
            content = event["content"]
            if isinstance(content, dict):
                mid = content.get("id") or (content.get("data") or {}).get("id")
                if mid in wanted:
                    result[mid] = event["run_id"]
        return result


@mutant("last-visible-shows-hidden")
class LastVisibleShowsHidden(MemoryEventStore):
    """get_last_visible_ai_seq_by_run counts AI messages of ``middleware:`` callers."""

    async def get_last_visible_ai_seq_by_run(self, thread_id: str, *, run_ids: Iterable[str] | None = None,
                                             user_id: UserId = AUTO) -> dict[str, int]:
        await super().get_last_visible_ai_seq_by_run(thread_id, run_ids=run_ids, user_id=user_id)
        thread = self._threads.get(thread_id)
        wanted = None if run_ids is None else set(run_ids)
        out: dict[str, int] = {}
        if thread is None or wanted == set():
            return out
        for record in thread.messages.rows:
            stripped = {**record, "metadata": {}}
            if (wanted is None or record["run_id"] in wanted) and is_visible_ai_message(stripped):
                out[record["run_id"]] = record["seq"]
        return out


@mutant("last-visible-first")
class LastVisibleFirst(MemoryEventStore):
    """get_last_visible_ai_seq_by_run returns each run's first visible AI message."""

    async def get_last_visible_ai_seq_by_run(self, thread_id: str, *, run_ids: Iterable[str] | None = None,
                                             user_id: UserId = AUTO) -> dict[str, int]:
        await super().get_last_visible_ai_seq_by_run(thread_id, run_ids=run_ids, user_id=user_id)
        thread = self._threads.get(thread_id)
        wanted = None if run_ids is None else set(run_ids)
        out: dict[str, int] = {}
        if thread is None or wanted == set():
            return out
        for record in thread.messages.rows:
            if (wanted is None or record["run_id"] in wanted) and is_visible_ai_message(record):
                out.setdefault(record["run_id"], record["seq"])
        return out


@mutant("last-visible-empty-means-all")
class LastVisibleEmptyMeansAll(MemoryEventStore):
    """get_last_visible_ai_seq_by_run treats an empty ``run_ids`` like ``None`` (every run)."""

    async def get_last_visible_ai_seq_by_run(self, thread_id: str, *, run_ids: Iterable[str] | None = None,
                                             user_id: UserId = AUTO) -> dict[str, int]:
        run_ids = None if run_ids is not None and not set(run_ids) else run_ids
        return await super().get_last_visible_ai_seq_by_run(thread_id, run_ids=run_ids, user_id=user_id)


@mutant("message-seqs-latest")
class MessageSeqsLatest(MemoryEventStore):
    """get_message_seqs maps an identity to its latest seq instead of the earliest."""

    async def get_message_seqs(self, thread_id: str, identities: Iterable[str], *,
                               user_id: UserId = AUTO) -> dict[str, int]:
        from runstore.events.identity import message_identity

        wanted = set(await super().get_message_seqs(thread_id, identities, user_id=user_id))
        thread = self._threads.get(thread_id)
        out: dict[str, int] = {}
        for record in thread.messages.rows if thread else []:
            ident = message_identity(record["content"])
            if ident in wanted:
                out[ident] = record["seq"]
        return out


# --------------------------------------------------------------------------- deletes and seq


@mutant("seq-counter-survives-delete")
class SeqCounterSurvivesDelete(MemoryEventStore):
    """After a delete, the next seq continues from the highest ever handed out,
    instead of the highest remaining + 1 (a deleted thread does not restart at 1)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._high: dict[str, int] = {}

    def _append(self, event: PreparedEvent) -> EventRecord:
        thread = self._threads.setdefault(event.thread_id, _Thread())
        thread.last_seq = max(thread.last_seq, self._high.get(event.thread_id, 0))
        record = super()._append(event)
        self._high[event.thread_id] = record["seq"]
        return record


@mutant("seq-from-count")
class SeqFromCount(MemoryEventStore):
    """The next seq is the number of remaining events + 1: after deleting a middle
    run, seqs are handed out twice."""

    def _append(self, event: PreparedEvent) -> EventRecord:
        thread = self._threads.setdefault(event.thread_id, _Thread())
        thread.last_seq = sum(len(rows) for rows in thread.runs.values())
        return super()._append(event)


@mutant("delete-keeps-absent-keys")
class DeleteKeepsAbsentKeys(MemoryEventStore):
    """delete_by_run leaves the ``(run, event_type)`` index behind, so put_if_absent
    still returns a deleted record."""

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._threads.get(thread_id)
        keys = dict(thread.keys) if thread else {}
        removed = await super().delete_by_run(thread_id, run_id, user_id=user_id)
        thread = self._threads.get(thread_id)
        if thread is not None:
            for key, record in keys.items():
                thread.keys.setdefault(key, record)
        return removed


@mutant("delete-keeps-identities")
class DeleteKeepsIdentities(MemoryEventStore):
    """delete_by_run leaves the message-identity index behind, so get_message_seqs
    still answers with a deleted seq."""

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._threads.get(thread_id)
        identities = dict(thread.identities) if thread else {}
        removed = await super().delete_by_run(thread_id, run_id, user_id=user_id)
        thread = self._threads.get(thread_id)
        if thread is not None:
            for key, seq in identities.items():
                thread.identities.setdefault(key, seq)
        return removed


@mutant("delete-by-run-counts-messages")
class DeleteByRunCountsMessages(MemoryEventStore):
    """delete_by_run returns how many *messages* it deleted, not how many events."""

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._threads.get(thread_id)
        rows = thread.run_messages.get(run_id) if thread else None
        messages = len(rows) if rows is not None else 0
        await super().delete_by_run(thread_id, run_id, user_id=user_id)
        return messages


@mutant("put-if-absent-per-run")
class PutIfAbsentPerRun(MemoryEventStore):
    """put_if_absent keys on ``(thread, run)`` only, ignoring ``event_type``."""

    async def put_if_absent(self, *, thread_id: str, run_id: str, event_type: str, category: str,
                            content: Any = "", metadata: Mapping[str, Any] | None = None,
                            created_at: str | None = None, user_id: UserId = AUTO) -> tuple[EventRecord, bool]:
        thread = self._threads.get(thread_id)
        rows = thread.runs.get(run_id) if thread else None
        if rows is not None and rows.rows and isinstance(event_type, str) and event_type:
            return copy_record(rows.rows[0]), False
        return await super().put_if_absent(
            thread_id=thread_id, run_id=run_id, event_type=event_type, category=category,
            content=content, metadata=metadata, created_at=created_at, user_id=user_id,
        )


def _factory(cls: type[MemoryEventStore]) -> Any:
    async def open_mutant(url: BackendURL, options: BackendOptions) -> RunEventStore:
        return await cls.open(url.with_query(), options)

    return open_mutant


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    for name, cls in MUTANTS.items():
        registry.add(name, schemes=[name], factory=_factory(cls))
