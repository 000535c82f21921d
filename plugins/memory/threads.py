"""The in-process saver's thread records: the thread index, retention sweeps and purges,
as `ThreadRecords`, a base class of `runstore.plugins.memory.saver.MemorySaver`.

They read and change the saver's `runstore.plugins.memory.layout` structures under the
saver's lock, like every other method of the saver.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from runstore.checkpoint.filters import metadata_matches
from runstore.checkpoint.policy import (
    RetentionPolicy,
    SweepBatch,
    ThreadSwept,
    batch_of,
    check_overrides,
    check_sweep,
    claimable,
    due,
    plan_thread,
)
from runstore.checkpoint.rules import checked_ids, checked_text
from runstore.checkpoint.threads import (
    Removed,
    ThreadInfo,
    ThreadPage,
    clock_micros,
    next_cursor,
    status_of,
    thread_info,
    thread_query,
)
from runstore.clock import Clock
from runstore.errors import ThreadDeletedError

from .layout import Namespace, ThreadRecord, footprint, locked


class ThreadRecords:
    """Thread index, retention and purges over the saver's namespaces and records."""

    clock: Clock
    _threads: dict[str, dict[str, Namespace]]
    _records: dict[str, ThreadRecord]
    _lock: threading.RLock

    def _purge(self, thread_ids: Sequence[str], *, dry_run: bool) -> Removed:
        now = clock_micros(self.clock)
        removed = Removed()
        for thread_id in thread_ids:
            namespaces = self._threads.get(thread_id, {})
            live = self._info(thread_id) is not None
            removed += Removed(int(live)) + footprint(namespaces.values())
            if dry_run:
                continue
            self._threads.pop(thread_id, None)
            record = self._records.get(thread_id)
            if record is not None:
                record.restart(now)
                record.deleted_at = now
        return removed

    @locked
    # ------------------------------------------------------------------ retention

    @locked
    def set_thread_retention(self, thread_id: str, overrides: Mapping[str, Any] | None) -> None:
        """Store retention overrides with the thread (``None`` clears them; docs/threads.md)."""
        text = check_overrides(overrides)
        thread = checked_text(thread_id, "thread_id")
        now = clock_micros(self.clock)
        record = self._records.get(thread)
        if record is not None and record.deleted_at is not None:
            raise ThreadDeletedError(thread)
        if record is None:
            record = self._records[thread] = ThreadRecord(now, now, now)
        record.retention = None if text is None else orjson.loads(text)
        record.swept_at = None

    async def aset_thread_retention(
        self, thread_id: str, overrides: Mapping[str, Any] | None
    ) -> None:
        """Async `set_thread_retention`."""
        self.set_thread_retention(thread_id, overrides)

    @locked
    def touch_thread(self, thread_id: str) -> bool:
        """Count a read as activity: ``touched_at`` (where ``idle_ttl`` counts from) becomes
        now; whether the thread exists."""
        record = self._records.get(checked_text(thread_id, "thread_id"))
        if record is None or record.deleted_at is not None:
            return False
        record.touched_at = max(record.touched_at, clock_micros(self.clock))
        return True

    async def atouch_thread(self, thread_id: str) -> bool:
        """Async `touch_thread`."""
        return self.touch_thread(thread_id)

    async def asweep(
        self,
        policy: RetentionPolicy,
        *,
        after: str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        claim_seconds: float = 300.0,
        rescan: bool = False,
        thread_ids: Sequence[str] | None = None,
    ) -> SweepBatch:
        """One bounded batch of a retention sweep (the SQL savers' contract: claims up to
        ``limit`` threads after ``after`` and applies ``policy`` to each live one)."""
        claim = check_sweep(policy, limit, claim_seconds)
        only = None if thread_ids is None else checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        until = None if dry_run else now + claim
        claimed = self._sweep_claim(policy, now, after, limit, until, rescan, only)
        swept = [self._sweep_thread(t, policy, now, dry_run) for t, gone in claimed if not gone]
        return batch_of(claimed, swept, limit)

    @locked
    def _sweep_claim(
        self,
        policy: RetentionPolicy,
        now: int,
        after: str | None,
        limit: int,
        until: int | None,
        rescan: bool,
        only: Sequence[str] | None,
    ) -> builtins.list[tuple[str, bool]]:
        claimed: builtins.list[tuple[str, bool]] = []
        pool = self._records if only is None else [t for t in set(only) if t in self._records]
        for thread_id in sorted(t for t in pool if after is None or t > after):
            record = self._records[thread_id]
            if not claimable(record.claimed_until, now):
                continue
            if record.deleted_at is not None:
                wanted = record.swept_at is None
            else:
                namespaces = self._threads.get(thread_id, {}).values()
                created = [e.created_at for ns in namespaces for e in ns.entries.values()]
                wanted = due(
                    policy,
                    now,
                    has_overrides=record.retention is not None,
                    touched_at=record.touched_at,
                    checkpoints=len(created),
                    oldest_at=min(created, default=None),
                    swept_at=record.swept_at,
                    sweep_after=record.sweep_after,
                    rescan=rescan,
                )
            if wanted:
                if until is not None:
                    record.claimed_until = until
                claimed.append((thread_id, record.deleted_at is not None))
                if len(claimed) == limit:
                    break
        return claimed

    @locked
    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        record = self._records.get(thread_id)
        if record is None or self._info(thread_id) is None:
            return None
        namespaces = self._threads.get(thread_id, {})
        plan = plan_thread(
            lambda: {name: ns.graph() for name, ns in namespaces.items()},
            policy.overridden(record.retention),
            now=now,
            touched_at=record.touched_at,
        )
        if plan.expire:
            return ThreadSwept(thread_id, True, self._purge([thread_id], dry_run=dry_run))
        removed = Removed()
        for name, gone in plan.doomed.items():
            ns = namespaces[name] if not dry_run else namespaces[name].copy()
            before = footprint([ns])
            ns.remove(set(gone))
            removed += before - footprint([ns])
        if not dry_run:
            record.swept_at, record.sweep_after = now, plan.sweep_after
            record.claimed_until = None
        return ThreadSwept(thread_id, False, removed)

    @locked
    def purge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """`delete_thread` for several threads, answering what went (a dry run only counts)."""
        return self._purge(checked_ids(thread_ids, "thread_ids"), dry_run=dry_run)

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """Async `purge_threads`."""
        return self.purge_threads(thread_ids, dry_run=dry_run)

    @locked
    def finish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Mark deleted threads whose events and stream keys are gone as done (the sweeper)."""
        now = clock_micros(self.clock)
        for thread_id in checked_ids(thread_ids, "thread_ids"):
            record = self._records.get(thread_id)
            if record is not None and record.deleted_at is not None:
                record.swept_at, record.claimed_until = now, None

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Async `finish_cleanup`."""
        self.finish_cleanup(thread_ids)

    # ------------------------------------------------------------------ thread index

    def _info(self, thread_id: str) -> ThreadInfo | None:
        """The thread's `ThreadInfo`, computed from its namespaces (``None``: not live)."""
        record = self._records.get(thread_id)
        namespaces = self._threads.get(thread_id)
        if record is None or record.deleted_at is not None or not namespaces:
            return None
        checkpoints = sum(len(ns.entries) for ns in namespaces.values())
        if not checkpoints:
            return None
        root = namespaces.get("")
        head = root.latest() if root is not None else None
        metadata: dict[str, Any] = {}
        status = "idle"
        if root is not None and head is not None:
            metadata = root.entries[head].stored_metadata
            head_writes = root.writes.get(head)
            if head_writes is not None:
                status = status_of(w[1] for w in head_writes.by_key.values())
        held = footprint(namespaces.values())
        return thread_info(
            thread_id,
            created_at=record.created_at,
            updated_at=record.updated_at,
            touched_at=record.touched_at,
            latest_checkpoint_id=head,
            checkpoints=checkpoints,
            writes=held.writes,
            bytes=held.bytes,
            status=status,
            metadata=metadata,
            retention=record.retention,
        )

    @locked
    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread's index record, or ``None`` if it has no checkpoint (or was deleted)."""
        return self._info(checked_text(thread_id, "thread_id"))

    @locked
    def list_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """One page of threads, newest first by ``order_by`` (docs/threads.md)."""
        query = thread_query(
            filter=filter,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            order_by=order_by,
            limit=limit,
            cursor=cursor,
        )
        keyed: list[tuple[tuple[int, str], str]] = []
        for thread_id, record in self._records.items():
            if record.deleted_at is not None:
                continue
            if query.updated_after is not None and record.updated_at <= query.updated_after:
                continue
            if query.updated_before is not None and record.updated_at >= query.updated_before:
                continue
            key = (record.updated_at if order_by == "updated_at" else record.created_at, thread_id)
            if query.after is not None and key >= query.after:
                continue
            keyed.append((key, thread_id))
        keyed.sort(reverse=True)
        threads: list[ThreadInfo] = []
        for _, thread_id in keyed:
            info = self._info(thread_id)
            if info is None or (query.status is not None and info.status != query.status):
                continue
            if not metadata_matches(info.metadata, query.terms):
                continue
            threads.append(info)
            if len(threads) == query.limit:
                break
        return ThreadPage(threads, next_cursor(query, threads))

    async def aget_thread(self, thread_id: str) -> ThreadInfo | None:
        """Async `get_thread`."""
        return self.get_thread(thread_id)

    async def alist_threads(self, **kwargs: Any) -> ThreadPage:
        """Async `list_threads` (same keyword arguments)."""
        return self.list_threads(**kwargs)
