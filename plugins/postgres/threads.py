"""The PostgreSQL saver's thread records: deletion (tombstones and fences), copy, prune,
``delete_for_runs``, the thread index and retention, as `ThreadRecords`, a base class of
`runstore.plugins.postgres.saver.PostgresSaver`.

Each method is the Python glue around its statements in
`runstore.plugins.postgres.thread_sql`, run on the saver's leased connections; the
checkpoint reads and writes, and the connections, are the saver's own.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from runstore.checkpoint import codec
from runstore.checkpoint.policy import (
    CheckpointGraph,
    Compaction,
    DryRun,
    RetentionPolicy,
    SweepBatch,
    ThreadSwept,
    batch_of,
    check_overrides,
    check_sweep,
    expired,
    plan_thread,
)
from runstore.checkpoint.prefetch import PrefetchStore
from runstore.checkpoint.rules import (
    check_fence,
    check_prune_strategy,
    checked_ids,
    checked_text,
)
from runstore.checkpoint.threads import (
    Removed,
    ThreadInfo,
    ThreadPage,
    clock_micros,
    next_cursor,
    thread_info,
    thread_query,
)
from runstore.clock import Clock
from runstore.errors import StaleFenceError, ThreadDeletedError
from runstore.twins import run_sync

from . import thread_sql
from .connections import PostgresCalls

R = TypeVar("R")


class ThreadRecords:
    """The saver's operations on whole threads and their records (module docstring).

    Runs on what `PostgresSaver` sets up: its leased connections, its clock, its
    prefetched histories and the blobs it knows are stored (a deletion forgets them).
    """

    clock: Clock
    loop: asyncio.AbstractEventLoop
    _leases: PostgresCalls
    _prefetch: PrefetchStore
    _known: OrderedDict[tuple[str, str, str, str], None]
    #: One write statement through the saver's group commit (`PostgresSaver._write`).
    _write: Callable[[str, tuple[Any, ...], str, int | None], Coroutine[Any, Any, None]]

    async def _delete(
        self, fn: Callable[[Any], Coroutine[Any, Any, R]], operation: str, begin: str | None = None
    ) -> R:
        """Run a deleting write (idempotent) and forget the blobs known to be stored."""
        try:
            with self._prefetch.writing():
                return await self._leases.run(
                    fn, operation=operation, write=True, idempotent=True, begin=begin
                )
        finally:
            # Even when the call failed or was cancelled: its delete may have committed,
            # and a blob believed stored would never be written again.
            self._known.clear()

    async def adelete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Delete every checkpoint, value and write of ``thread_id`` (all namespaces); the
        thread keeps a tombstone that refuses late writes. With ``fence``, refused
        (`StaleFenceError`) if the thread has seen a newer token."""
        thread_id = checked_text(thread_id, "thread_id")
        token = None if fence is None else check_fence(fence)
        await self._purge([thread_id], dry_run=False, fence=token)

    async def afence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` without writing anything else: from now on
        writes carrying an older token are refused. `StaleFenceError` if it holds a newer one."""
        thread_id, fence = checked_text(thread_id, "thread_id"), check_fence(fence)
        # One idempotent statement in the group commit: concurrent grants share its round
        # trip and commit with each other's (and their runs') checkpoint writes.
        args = (thread_id, clock_micros(self.clock), fence)
        await self._write(thread_sql.RAISE_FENCE_SQL, args, thread_id, fence)

    async def _purge(
        self, thread_ids: Sequence[str], *, dry_run: bool, fence: int | None = None
    ) -> Removed:
        now = clock_micros(self.clock)

        async def go(conn: Any) -> Removed:
            removed = Removed()
            # Sorted: two deletions of the same threads lock them in one order.
            for thread_id in sorted(set(thread_ids)):
                if fence is not None:
                    await _fence(conn, thread_id, now, fence)
                live = await conn.fetchval(thread_sql.LOCK_THREAD_SQL, thread_id)
                removed += await _purge_locked(conn, thread_id, bool(live), now, dry_run)
            return removed

        if dry_run:
            return await self._leases.run(go, operation="purge_thread", begin="BEGIN")
        return await self._delete(go, "delete_thread", begin="BEGIN")

    async def _remove_checkpoints(
        self, conn: Any, thread_id: str, ns: str, ids: Sequence[str]
    ) -> Removed:
        """Delete checkpoints ``ids`` of one namespace with their writes and the blobs no
        remaining checkpoint holds, and shrink the thread's record by what went."""
        ck, ck_bytes, wr, wr_bytes = await conn.fetchrow(
            thread_sql.DELETE_CHECKPOINTS_SQL, thread_id, ns, list(ids)
        )
        bl, bl_bytes = await conn.fetchrow(thread_sql.DELETE_GARBAGE_BLOBS_SQL, thread_id, ns)
        removed = Removed(0, ck, wr, bl, ck_bytes + wr_bytes + bl_bytes)
        await conn.execute(
            thread_sql.SHRINK_THREAD_SQL,
            thread_id,
            ck,
            wr,
            removed.bytes,
            list(ids) if ns == "" else [],
        )
        return removed

    # -- retention ---------------------------------------------------------------

    async def aset_thread_retention(
        self, thread_id: str, overrides: Mapping[str, Any] | None
    ) -> None:
        """Store retention overrides with the thread (``None`` clears them; docs/threads.md)."""
        text = check_overrides(overrides)
        thread = checked_text(thread_id, "thread_id")
        now = clock_micros(self.clock)

        async def go(conn: Any) -> Any:
            return await conn.fetchval(thread_sql.SET_RETENTION_SQL, thread, now, text)

        if await self._leases.run(go, operation="set_thread_retention", write=True, idempotent=True) is None:
            raise ThreadDeletedError(thread)

    async def atouch_thread(self, thread_id: str) -> bool:
        """Count a read as activity: ``touched_at`` (where ``idle_ttl`` counts from) becomes
        now; whether the thread exists (docs/threads.md)."""
        thread = checked_text(thread_id, "thread_id")
        now = clock_micros(self.clock)

        async def go(conn: Any) -> bool:
            return await conn.fetchval(thread_sql.TOUCH_THREAD_SQL, thread, now) is not None

        return bool(
            await self._leases.run(go, operation="touch_thread", write=True, idempotent=True)
        )

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
        """One bounded batch of a retention sweep (`runstore.sweeper` runs the passes):
        claims up to ``limit`` threads after ``after`` (``FOR UPDATE SKIP LOCKED``: several
        sweepers split the work and never wait for a writer) and applies ``policy`` to each
        live one in a transaction of its own; a ``dry_run`` claims nothing and rolls back."""
        claim = check_sweep(policy, limit, claim_seconds)
        only = None if thread_ids is None else checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        micros = 1_000_000
        args = (
            after or "",
            now,
            limit,
            None if policy.idle_ttl is None else now - int(policy.idle_ttl * micros),
            policy.keep_last,
            None if policy.max_age is None else now - int(policy.max_age * micros),
            None if dry_run else now + claim,
            rescan,
            only,
        )

        async def claim_batch(conn: Any) -> list[tuple[str, bool]]:
            statement = thread_sql.PEEK_SWEEP_SQL if dry_run else thread_sql.CLAIM_SWEEP_SQL
            return sorted((r[0], bool(r[1])) for r in await conn.fetch(statement, *args))

        claimed = await self._leases.run(
            claim_batch, operation="sweep", write=not dry_run, idempotent=True
        )
        swept = []
        for thread_id, deleted in claimed:
            if not deleted:
                swept.append(await self._sweep_thread(thread_id, policy, now, dry_run))
        return batch_of(claimed, swept, limit)

    async def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        async def go(conn: Any) -> ThreadSwept | None:
            state = await conn.fetchrow(thread_sql.SWEEP_STATE_SQL, thread_id)
            if state is None or state[0] is not None or not state[1]:
                return None
            effective = policy.overridden(orjson.loads(state[3]) if state[3] else None)
            graphs: dict[str, list[Any]] = {}
            if not expired(effective, now=now, touched_at=state[2]):
                for row in await conn.fetch(thread_sql.THREAD_GRAPH_SQL, thread_id):
                    graphs.setdefault(row[0], []).append(tuple(row)[1:])
            plan = plan_thread(
                lambda: {ns: CheckpointGraph(rows) for ns, rows in graphs.items()},
                effective,
                now=now,
                touched_at=state[2],
            )
            if plan.expire:
                swept = ThreadSwept(
                    thread_id, True, await _purge_locked(conn, thread_id, True, now, False)
                )
            else:
                removed = Removed()
                for ns, gone in plan.doomed.items():
                    removed += await self._remove_checkpoints(conn, thread_id, ns, gone)
                await conn.execute(thread_sql.SWEPT_THREAD_SQL, thread_id, now, plan.sweep_after)
                swept = ThreadSwept(thread_id, False, removed)
            if dry_run:
                raise DryRun(swept)
            return swept

        try:
            return await self._delete(go, "sweep", begin="BEGIN")
        except DryRun as answer:
            return answer.swept

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """`adelete_thread` for several threads, answering what went (a dry run only counts)."""
        ids = checked_ids(thread_ids, "thread_ids")
        return await self._purge(ids, dry_run=dry_run) if ids else Removed()

    async def acompact(self, *, full: bool = False) -> Compaction:
        """``VACUUM (ANALYZE)`` the saver's tables (``full``: ``VACUUM FULL``, which rewrites
        them under an exclusive lock: writers wait); their total size before and after.
        Autovacuum does the plain one on its own (docs/threads.md, "Giving disk back")."""

        async def go(conn: Any) -> tuple[int, int]:
            before = await conn.fetchval(thread_sql.SAVER_TABLES_SIZE_SQL)
            verb = "VACUUM (FULL, ANALYZE)" if full else "VACUUM (ANALYZE)"
            await conn.execute(f"{verb} {', '.join(thread_sql.SAVER_TABLES)}")
            return int(before), int(await conn.fetchval(thread_sql.SAVER_TABLES_SIZE_SQL))

        before, after = await self._leases.run(go, operation="compact", write=True, idempotent=True)
        return Compaction(before, after)

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Mark deleted threads whose events and stream keys are gone as done (the sweeper)."""
        ids = checked_ids(thread_ids, "thread_ids")
        if not ids:
            return
        now = clock_micros(self.clock)

        async def go(conn: Any) -> None:
            await conn.execute(thread_sql.CLEANED_THREADS_SQL, ids, now)

        await self._leases.run(go, operation="finish_cleanup", write=True, idempotent=True)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy the whole source thread (every checkpoint with its values and writes) in one statement."""
        src = checked_text(source_thread_id, "source_thread_id")
        dst = checked_text(target_thread_id, "target_thread_id")
        if src == dst:
            return

        now = clock_micros(self.clock)

        async def go(conn: Any) -> None:
            await conn.execute(thread_sql.COPY_THREAD_SQL, src, dst)
            if await conn.fetchval(thread_sql.THREAD_EXISTS_SQL, dst):
                await conn.execute(thread_sql.ENSURE_THREAD_SQL, dst, now)
                await conn.execute(thread_sql.REFRESH_THREAD_SQL, dst)

        with self._prefetch.writing(dst):
            await self._leases.run(
                go, operation="copy_thread", write=True, idempotent=True, begin="BEGIN"
            )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``delete`` drops them; ``keep_latest`` keeps each namespace's head and
        the ancestors (with their writes) its delta channels are rebuilt from."""
        ids = checked_ids(thread_ids, "thread_ids")
        if check_prune_strategy(strategy) == "delete":
            if ids:
                await self._purge(ids, dry_run=False)
            return
        if not ids:
            return

        async def go(conn: Any) -> None:
            # The keep set comes from one statement; checkpoints a running graph saves
            # meanwhile are newer than the latest it kept, and never touched. (Read
            # committed: the thread records shrink relative to concurrent writers' counts.)
            keep: dict[tuple[str, str], list[str]] = {}
            for r in await conn.fetch(thread_sql.PRUNE_KEEP_SQL, ids):
                keep.setdefault((r[0], r[1]), []).append(r[2])
            for thread_id in sorted({t for t, _ in keep}):
                await conn.fetchval(thread_sql.LOCK_THREAD_SQL, thread_id)
            for (thread_id, ns), kept in sorted(keep.items()):
                doomed = await conn.fetch(
                    f"SELECT checkpoint_id FROM {codec.CHECKPOINTS} WHERE thread_id = $1"
                    " AND checkpoint_ns = $2 AND checkpoint_id <> ALL($3::text[])"
                    " AND checkpoint_id < $4",
                    thread_id,
                    ns,
                    kept,
                    max(kept),
                )
                if not doomed:
                    continue
                gone = [r[0] for r in doomed]
                await self._remove_checkpoints(conn, thread_id, ns, gone)

        await self._delete(go, "prune", begin="BEGIN")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by ``run_ids``, except those a
        surviving checkpoint still rebuilds delta channels from."""
        ids = checked_ids(run_ids, "run_ids")
        if not ids:
            return

        async def go(conn: Any) -> None:
            doomed: dict[tuple[str, str], list[str]] = {}
            for r in await conn.fetch(thread_sql.RUNS_KEEP_SQL, ids):
                if not r["needed"]:
                    doomed.setdefault((r[0], r[1]), []).append(r[2])
            # Records first, in one order: a writer locks its record before its rows.
            for thread_id in sorted({t for t, _ in doomed}):
                await conn.fetchval(thread_sql.LOCK_THREAD_SQL, thread_id)
            for (thread_id, ns), gone in sorted(doomed.items()):
                await self._remove_checkpoints(conn, thread_id, ns, gone)

        await self._delete(go, "delete_for_runs", begin="BEGIN")

    # -- thread index ----------------------------------------------------------------

    async def aget_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread's index record, or ``None`` if it has no checkpoint (or was deleted)."""
        tid = checked_text(thread_id, "thread_id")

        async def go(conn: Any) -> Any:
            return await conn.fetchrow(thread_sql.GET_THREAD_SQL, tid)

        row = await self._leases.run(go, operation="get_thread")
        return None if row is None else thread_info(**dict(row))

    async def alist_threads(
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
        """One page of threads, newest first by ``order_by``, answered from the record
        table's indexes (docs/threads.md)."""
        query = thread_query(
            filter=filter,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            order_by=order_by,
            limit=limit,
            cursor=cursor,
        )
        statement, args = thread_sql.list_threads_sql(query)

        async def go(conn: Any) -> list[Any]:
            if query.terms:
                # Many matches: the newest records in index order fill the page at once.
                rows = await conn.fetch(*_flat(thread_sql.list_threads_sql(query, probe=True)))
                if len(rows) == query.limit:
                    return list(rows)
            return list(await conn.fetch(statement, *args))

        rows = await self._leases.run(go, operation="list_threads")
        threads = [thread_info(**dict(row)) for row in rows]
        return ThreadPage(threads, next_cursor(query, threads))

    def _sync(self, method: str, factory: Callable[[], Coroutine[Any, Any, R]]) -> R:
        return run_sync(self.loop, factory, method, type(self).__name__)

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Sync twin of `adelete_thread`."""
        self._sync("delete_thread", lambda: self.adelete_thread(thread_id, fence=fence))

    def fence_thread(self, thread_id: str, fence: int) -> None:
        """Sync twin of `afence_thread`."""
        self._sync("fence_thread", lambda: self.afence_thread(thread_id, fence))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync twin of `adelete_for_runs`."""
        self._sync("delete_for_runs", lambda: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync twin of `acopy_thread`."""
        self._sync("copy_thread", lambda: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync twin of `aprune`."""
        self._sync("prune", lambda: self.aprune(thread_ids, strategy=strategy))

    def set_thread_retention(self, thread_id: str, overrides: Mapping[str, Any] | None) -> None:
        """Sync twin of `aset_thread_retention` (not on the saver's event loop thread)."""
        self._sync(
            "set_thread_retention", lambda: self.aset_thread_retention(thread_id, overrides)
        )

    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """Sync twin of `aget_thread`."""
        return self._sync("get_thread", lambda: self.aget_thread(thread_id))

    def list_threads(self, **kwargs: Any) -> ThreadPage:
        """Sync twin of `alist_threads` (same keyword arguments)."""
        return self._sync("list_threads", lambda: self.alist_threads(**kwargs))


def _flat(statement: tuple[str, list[Any]]) -> list[Any]:
    return [statement[0], *statement[1]]


async def _purge_locked(
    conn: Any, thread_id: str, live: bool, now: int, dry_run: bool
) -> Removed:
    """Delete a thread whose record this transaction locked, leaving its tombstone (a dry
    run only counts); what its rows held."""
    statement = thread_sql.THREAD_FOOTPRINT_SQL if dry_run else thread_sql.PURGE_THREAD_SQL
    ck, ck_bytes, wr, wr_bytes, bl, bl_bytes = await conn.fetchrow(statement, thread_id)
    if not dry_run:
        await conn.execute(thread_sql.TOMBSTONE_THREAD_SQL, thread_id, now)
    return Removed(int(live), ck, wr, bl, ck_bytes + wr_bytes + bl_bytes)


async def _fence(conn: Any, thread_id: str, now: int, fence: int) -> None:
    """The fence compare-and-set (`thread_sql.FENCE_THREAD_SQL`) in ``conn``'s transaction;
    `StaleFenceError` (the caller's transaction then rolls back) if the thread holds a
    newer token."""
    if await conn.fetchval(thread_sql.FENCE_THREAD_SQL, thread_id, now, fence) is None:
        current = await conn.fetchval(thread_sql.FENCE_OF_SQL, thread_id)
        raise StaleFenceError(thread_id, fence, int(current))
