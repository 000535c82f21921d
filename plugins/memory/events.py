"""`MemoryEventStore`: the in-process run event store, indexed per thread and per run."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runstore.events.identity import message_identity
from runstore.events.owner import AUTO, UserId
from runstore.events.protocol import (
    MESSAGE_CATEGORY,
    EventContent,
    EventRecord,
    RunEventStore,
    RunSummary,
    summarize_runs,
)
from runstore.events.records import (
    PreparedEvent,
    copy_record,
    is_visible_ai_message,
    normalize_identities,
    normalize_run_ids,
    select_run_events,
)
from runstore.fencing import admit_fence, check_fence
from runstore.standalone import Standalone

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL


@dataclass
class _Rows:
    """Records in seq order plus their seqs, for O(log n) cursor lookups."""

    seqs: list[int] = field(default_factory=list)
    rows: list[EventRecord] = field(default_factory=list)

    def append(self, record: EventRecord) -> None:
        self.seqs.append(record["seq"])
        self.rows.append(record)

    def page(self, limit: int, before: int | None, after: int | None) -> list[EventRecord]:
        lo = 0 if after is None else bisect.bisect_right(self.seqs, after)
        hi = len(self.rows) if before is None else bisect.bisect_left(self.seqs, before)
        if hi <= lo or limit <= 0:
            return []
        if after is not None:
            return self.rows[lo : min(hi, lo + limit)]
        return self.rows[max(lo, hi - limit) : hi]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class _Thread:
    """One thread's events and the indexes every read uses."""

    last_seq: int = 0
    messages: _Rows = field(default_factory=_Rows)
    runs: dict[str, _Rows] = field(default_factory=dict)
    run_messages: dict[str, _Rows] = field(default_factory=dict)
    #: (run_id, event_type) -> earliest record, for put_if_absent
    keys: dict[tuple[str, str], EventRecord] = field(default_factory=dict)
    #: message identity -> earliest seq
    identities: dict[str, int] = field(default_factory=dict)

    def add(self, record: EventRecord) -> None:
        self.last_seq = record["seq"]
        run_id = record["run_id"]
        self.runs.setdefault(run_id, _Rows()).append(record)
        self.keys.setdefault((run_id, record["event_type"]), record)
        if record["category"] == MESSAGE_CATEGORY:
            self.messages.append(record)
            self.run_messages.setdefault(run_id, _Rows()).append(record)
            identity = message_identity(record["content"])
            if identity is not None:
                self.identities.setdefault(identity, record["seq"])

    def rebuild_without_run(self, run_id: str) -> int:
        """Drop a run and rebuild the thread-wide indexes (O(thread); deletes are rare)."""
        removed = self.runs.pop(run_id, None)
        if removed is None:
            return 0
        remaining = sorted(
            (r for rows in self.runs.values() for r in rows.rows), key=lambda r: r["seq"]
        )
        fresh = _Thread()
        for record in remaining:
            fresh.add(record)
        self.messages, self.runs, self.run_messages = fresh.messages, fresh.runs, fresh.run_messages
        self.keys, self.identities = fresh.keys, fresh.identities
        # The next seq follows the highest remaining one (same rule as the SQL stores).
        self.last_seq = fresh.last_seq
        return len(removed)


class MemoryEventStore(RunEventStore, Standalone):
    """In-process event store: per-thread indexes make a message page O(log n + page)
    and a run's events O(run). Nothing survives the process; ``user_id`` is resolved
    (so a missing owner context still fails) and otherwise ignored.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.memory.events import MemoryEventStore


    async def main() -> None:
        async with MemoryEventStore.from_conn_string("memory://") as store:
            # user_id=None: events without an owner (a web app wraps its calls in
            # runstore.owner_scope(user) instead)
            await store.put(thread_id="thread-1", run_id="run-1", event_type="human",
                            category="message", content="hello", user_id=None)
            page = await store.list_messages("thread-1", user_id=None)
            print([(event["seq"], event["content"]) for event in page])  # [(1, 'hello')]


    asyncio.run(main())
    ```
    """

    def __init__(self, *, max_trace_content: int = 10240) -> None:
        self._threads: dict[str, _Thread] = {}
        # Per thread, the highest fencing token a write carried (kept across deletes).
        self._fences: dict[str, int] = {}
        # Owners of imported events, kept only so an export hands them on (reads ignore owners).
        self._owners: dict[tuple[str, int], str] = {}
        self._max_trace = max_trace_content
        self._closed = False

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemoryEventStore:
        """Open a fresh, empty store for ``memory://`` (no URL options)."""
        url.check_options(set())
        return cls(max_trace_content=options.settings.run_events.max_trace_content)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MemoryEventStore is closed")

    def _fence(self, thread_ids: Iterable[str], fence: int | None) -> None:
        """Refuse a stale ``fence`` on any of the threads, else raise their fences to it
        (nothing awaits between this and the write it guards)."""
        if fence is None:
            return
        threads = set(thread_ids)
        raised = {t: admit_fence(fence, self._fences.get(t, 0), thread_id=t) for t in threads}
        self._fences.update(raised)

    def _append(self, event: PreparedEvent) -> EventRecord:
        thread = self._threads.setdefault(event.thread_id, _Thread())
        record = event.to_record(thread.last_seq + 1)
        thread.add(record)
        return record

    # -- writes ---------------------------------------------------------------------

    async def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> EventRecord:
        event, _ = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip
        self._fence([event.thread_id], fence)
        return copy_record(self._append(event))

    async def put_batch(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> list[EventRecord]:
        call = self._batch_call(events, user_id, max_trace_content=self._max_trace, fence=fence)
        if call is None:
            return []
        # Everything is validated first and nothing below awaits, so the batch is
        # atomic and each thread's block is contiguous.
        self._fence([event.thread_id for event in call[0]], fence)
        return [copy_record(self._append(event)) for event in call[0]]

    async def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> tuple[EventRecord, bool]:
        event, _ = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip
        self._fence([event.thread_id], fence)
        thread = self._threads.get(event.thread_id)
        existing = thread.keys.get((event.run_id, event.event_type)) if thread else None
        if existing is not None:
            return copy_record(existing), False
        return copy_record(self._append(event)), True

    async def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` (`StaleFenceError` if it is already higher)."""
        thread = self._check_id(thread_id, "thread_id")
        check_fence(fence)
        self._check_open()
        self._fence([thread], fence)

    # -- reads ----------------------------------------------------------------------

    async def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        page = self._page_call(thread_id, None, limit, before_seq, after_seq, user_id)
        thread = self._threads.get(page.thread_id) if page else None
        if page is None or thread is None:
            return []
        return [
            copy_record(r) for r in thread.messages.page(page.limit, page.before_seq, page.after_seq)
        ]

    async def list_events(
        self,
        thread_id: str,
        run_id: str,
        *,
        event_types: Sequence[str] | None = None,
        task_id: str | None = None,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        call = self._run_filter_call(
            thread_id, run_id, event_types, task_id, limit, after_seq, user_id
        )
        thread = self._threads.get(call.thread_id) if call else None
        rows = thread.runs.get(call.run_id) if call and thread else None
        if call is None or rows is None:
            return []
        start = 0 if call.after_seq is None else bisect.bisect_right(rows.seqs, call.after_seq)
        selected = select_run_events(
            rows.rows[start:], limit=call.limit, event_types=call.event_types, task_id=call.task_id
        )
        return [copy_record(r) for r in selected]

    async def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 500,
        after_seq: int | None = None,
        before_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        page = self._page_call(thread_id, run_id, limit, before_seq, after_seq, user_id)
        thread = self._threads.get(page.thread_id) if page else None
        rows = thread.run_messages.get(run_id) if thread else None
        if page is None or rows is None:
            return []
        return [copy_record(r) for r in rows.page(page.limit, page.before_seq, page.after_seq)]

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._threads.get(self._target_call(thread_id, None, user_id).thread_id)
        return len(thread.messages) if thread else 0

    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        user_id: UserId = AUTO,
    ) -> dict[str, int]:
        call = self._lookup_call(thread_id, run_ids, normalize_run_ids, user_id)
        thread = self._threads.get(call.thread_id) if call else None
        if call is None or thread is None:
            return {}
        result: dict[str, int] = {}
        runs = thread.run_messages if call.keys is None else {
            r: thread.run_messages[r] for r in call.keys if r in thread.run_messages
        }
        for run_id, rows in runs.items():
            for record in reversed(rows.rows):
                if is_visible_ai_message(record):
                    result[run_id] = record["seq"]
                    break
        return result

    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        call = self._lookup_call(thread_id, identities, normalize_identities, user_id)
        thread = self._threads.get(call.thread_id) if call else None
        if call is None or call.keys is None or thread is None:
            return {}
        return {i: thread.identities[i] for i in call.keys if i in thread.identities}

    # -- deletes --------------------------------------------------------------------

    async def list_runs(self, thread_id: str, *, user_id: UserId = AUTO) -> list[RunSummary]:
        target = self._target_call(thread_id, None, user_id)
        thread = self._threads.get(target.thread_id)
        if thread is None:
            return []
        return summarize_runs(r for rows in thread.runs.values() for r in rows.rows)

    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._threads.pop(self._target_call(thread_id, None, user_id).thread_id, None)
        return sum(len(rows) for rows in thread.runs.values()) if thread else 0

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        target = self._target_call(thread_id, run_id, user_id)
        thread = self._threads.get(target.thread_id)
        if thread is None:
            return 0
        removed = thread.rebuild_without_run(run_id)
        if not thread.runs:
            del self._threads[target.thread_id]
        return removed

    # -- bulk_import ---------------------------------------------------------------------

    async def aexport_thread_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """Up to ``limit`` thread ids holding events, ascending, after ``after`` (`BulkEventStore`)."""
        self._check_open()
        ids = sorted(t for t, thread in self._threads.items() if thread.runs and (after is None or t > after))
        return ids[:limit]

    async def aexport_events(
        self, thread_id: str, *, after_seq: int | None = None, limit: int = 500
    ) -> list[EventRecord]:
        """The thread's first ``limit`` events above ``after_seq`` (`BulkEventStore`)."""
        thread_id = self._check_id(thread_id, "thread_id")
        self._check_open()
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        after = 0 if after_seq is None else after_seq
        rows = sorted((r for rows in thread.runs.values() for r in rows.rows if r["seq"] > after), key=lambda r: r["seq"])
        return [self._exported(r) for r in rows[:limit]]

    def _exported(self, record: EventRecord) -> EventRecord:
        out = copy_record(record)
        out["user_id"] = self._owners.get((record["thread_id"], record["seq"]))
        return out

    async def aimport_events(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Insert ``records`` under their own seqs unless already held (`BulkEventStore`)."""
        from runstore.events.bulk import prepare_import

        prepared = [prepare_import(record) for record in records]
        self._check_open()
        inserted = 0
        for event, seq, owner in prepared:
            thread = self._threads.setdefault(event.thread_id, _Thread())
            held = {r["seq"] for rows in thread.runs.values() for r in rows.rows} if seq <= thread.last_seq else ()
            if seq in held:
                continue
            record = event.to_record(seq)
            if owner is not None:
                self._owners[(event.thread_id, seq)] = owner
            if seq > thread.last_seq:
                thread.add(record)
            else:  # below the thread's last seq: rebuild its indexes in seq order
                rows = sorted([*(r for rs in thread.runs.values() for r in rs.rows), record], key=lambda r: r["seq"])
                fresh = _Thread()
                for row in rows:
                    fresh.add(row)
                self._threads[event.thread_id] = fresh
            inserted += 1
        return inserted

    async def close(self) -> None:
        self._closed = True
        self._threads.clear()
