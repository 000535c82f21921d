"""The retention sweeper: a policy applied across a runtime's stores, in bounded batches.

The saver decides and deletes (`runstore.checkpoint.policy`; each saver's ``asweep``
claims a batch and sweeps each thread in a transaction of its own). This module runs
the passes and finishes what a saver cannot reach: a thread the saver expired (or a
caller deleted) also loses its stream keys and its events. The order, per thread:

1. the saver deletes the thread and leaves its tombstone (one transaction): from here
   late writes continuing the thread are refused;
2. the stream bridge drops each run's stream (run ids from the event store's
   ``list_runs`` and the run store's ``list_by_thread``; one key per run);
3. the event store deletes the thread's events (one transaction);
4. the saver marks the tombstone done (``afinish_cleanup``).

A failure or crash between steps leaves the tombstone not done, so the next pass
hands the thread out again and repeats 2-4, each idempotent. A pass ends by deleting the
long-term memory store's expired items (``asweep_expired``), when one is open. Entry points:
`sweep` (one pass; ``runstore retention run``), `start_sweeper` (an asyncio task an
app starts), `delete_thread` (one thread now, everywhere, with counts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from runstore.checkpoint.contracts import CompactingSaver, RetentionSaver, contract_methods
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.checkpoint.policy import RetentionPolicy, SweepBatch
from runstore.checkpoint.threads import Removed
from runstore.errors import InvalidSaverInputError

if TYPE_CHECKING:
    from runstore.events.protocol import RunEventStore
    from runstore.runs.protocol import RunStore
    from runstore.stores import Stores
    from runstore.streams.protocol import StreamBridge

log = logging.getLogger("runstore.sweeper")

__all__ = [
    "SweepReport",
    "Sweeper",
    "ThreadDeletion",
    "delete_thread",
    "start_sweeper",
    "sweep",
]


@dataclass(frozen=True)
class ThreadDeletion:
    """What deleting one thread everywhere removed (or, in a dry run, would remove)."""

    thread_id: str
    saver: Removed
    events: int
    streams: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "thread_id": self.thread_id,
            "saver": self.saver.as_dict(),
            "events": self.events,
            "streams": self.streams,
        }


@dataclass
class SweepReport:
    """One sweep pass, summed over its batches.

    ``examined``: threads the saver looked at; ``trimmed``: those that lost checkpoints;
    ``expired``: those deleted whole; ``cleaned``: deleted threads whose events and
    stream keys this pass removed; ``removed``: saver rows and their bytes; ``events``,
    ``streams``: event rows and run streams removed; ``store_items``: expired items the
    long-term memory store deleted; ``reclaimed_bytes``: file space given
    back by compaction (sqlite), when the pass compacted.
    """

    dry_run: bool = False
    batches: int = 0
    examined: int = 0
    trimmed: int = 0
    expired: int = 0
    cleaned: int = 0
    removed: Removed = field(default_factory=Removed)
    events: int = 0
    streams: int = 0
    store_items: int = 0
    reclaimed_bytes: int | None = None
    seconds: float = 0.0

    def add(self, batch: SweepBatch) -> None:
        """Count one saver batch."""
        self.batches += 1
        self.examined += len(batch.threads)
        self.trimmed += sum(1 for t in batch.threads if not t.expired and t.removed.checkpoints)
        self.expired += sum(1 for t in batch.threads if t.expired)
        self.removed += batch.removed

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "dry_run": self.dry_run,
            "batches": self.batches,
            "threads_examined": self.examined,
            "threads_trimmed": self.trimmed,
            "threads_expired": self.expired,
            "threads_cleaned": self.cleaned,
            **{f"saver_{k}": v for k, v in self.removed.as_dict().items() if k != "threads"},
            "events": self.events,
            "streams": self.streams,
            "store_items": self.store_items,
            "reclaimed_bytes": self.reclaimed_bytes,
            "seconds": round(self.seconds, 3),
            "threads_per_second": round(self.examined / self.seconds, 1) if self.seconds else None,
        }


@dataclass(frozen=True)
class Sweeper:
    """The stores a sweep reaches: a saver declaring ``retention``, and optionally the
    event store, stream bridge, run store and long-term memory store of the same runtime."""

    saver: Any
    events: RunEventStore | None = None
    streams: StreamBridge | None = None
    runs: RunStore | None = None
    store: Any = None

    @classmethod
    def from_stores(cls, stores: Stores) -> Sweeper:
        """The opened stores of ``runstore.open`` (the saver behind its wrappers)."""
        opened = set(stores.opened)
        return cls(
            saver=unwrap_saver(stores.checkpointer),
            events=stores.events if "events" in opened else None,
            streams=stores.streams if "streams" in opened else None,
            runs=stores.runs if "runs" in opened else None,
            store=stores.store if "store" in opened else None,
        )

    def __post_init__(self) -> None:
        if not isinstance(unwrap_saver(self.saver), RetentionSaver):
            missing = [m for m in contract_methods(RetentionSaver) if not hasattr(self.saver, m)]
            raise InvalidSaverInputError(
                f"{type(self.saver).__name__} does not declare retention: it lacks "
                f"{', '.join(missing)} (runstore.checkpoint.contracts.RetentionSaver); "
                "runstore's memory, sqlite and postgres savers have them"
            )

    async def _run_ids(self, thread_id: str) -> list[str]:
        ids: dict[str, None] = {}
        if self.events is not None:
            for run in await self.events.list_runs(thread_id, user_id=None):
                ids[run.run_id] = None
        if self.runs is not None:
            for record in await self.runs.list_by_thread(thread_id):
                ids[record["run_id"]] = None
        return list(ids)

    async def cleanup(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> tuple[int, int]:
        """Steps 2-4 of the module docstring for deleted threads: ``(events, streams)`` removed
        (a dry run counts the events and runs, removes nothing and marks nothing)."""
        events = streams = 0
        for thread_id in thread_ids:
            run_ids = await self._run_ids(thread_id)
            if self.streams is not None:
                for run_id in run_ids:
                    if dry_run:
                        streams += int(await self.streams.stream_exists(run_id))
                    elif await self.streams.stream_exists(run_id):
                        await self.streams.cleanup(run_id)
                        streams += 1
            if self.events is not None:
                if dry_run:
                    events += sum(r.events for r in await self.events.list_runs(thread_id, user_id=None))
                else:
                    events += await self.events.delete_by_thread(thread_id, user_id=None)
        if not dry_run and thread_ids:
            await self.saver.afinish_cleanup(list(thread_ids))
        return events, streams

    async def sweep(
        self,
        policy: RetentionPolicy,
        *,
        batch_size: int = 100,
        dry_run: bool = False,
        claim_seconds: float = 300.0,
        rescan: bool = False,
        thread_ids: Sequence[str] | None = None,
        progress: Callable[[SweepReport], None] | None = None,
        compact: bool = False,
    ) -> SweepReport:
        """One pass over the threads in ``batch_size`` batches; ``progress`` is called after
        each. With ``compact``, a pass that removed something ends with the saver's
        ``acompact`` (sqlite: give the freed pages back; see docs/threads.md)."""
        report = SweepReport(dry_run=dry_run)
        started = time.perf_counter()
        after: str | None = None
        while True:
            batch: SweepBatch = await self.saver.asweep(
                policy,
                after=after,
                limit=batch_size,
                dry_run=dry_run,
                claim_seconds=claim_seconds,
                rescan=rescan,
                thread_ids=thread_ids,
            )
            report.add(batch)
            if batch.cleanup:
                events, streams = await self.cleanup(batch.cleanup, dry_run=dry_run)
                report.events += events
                report.streams += streams
                report.cleaned += len(batch.cleanup)
            report.seconds = time.perf_counter() - started
            if progress is not None:
                progress(report)
            if batch.cursor is None:
                break
            after = batch.cursor
        if not dry_run and callable(getattr(self.store, "asweep_expired", None)):
            # TTL expiry is the store's own rule (no policy applies); a dry run skips it.
            report.store_items = await self.store.asweep_expired()
            report.seconds = time.perf_counter() - started
        if compact and not dry_run and report.removed.bytes:
            saver = unwrap_saver(self.saver)
            if isinstance(saver, CompactingSaver):
                report.reclaimed_bytes = (await saver.acompact()).reclaimed
                report.seconds = time.perf_counter() - started
        return report


async def sweep(stores: Stores, policy: RetentionPolicy | None = None, **kwargs: Any) -> SweepReport:
    """One sweep pass over ``stores`` with ``policy`` (default: the ``retention`` settings)."""
    section = stores.settings.retention
    kwargs.setdefault("batch_size", section.batch_size)
    kwargs.setdefault("claim_seconds", section.claim_seconds)
    chosen = policy if policy is not None else RetentionPolicy.from_settings(stores.settings)
    return await Sweeper.from_stores(stores).sweep(chosen, **kwargs)


def start_sweeper(
    stores: Stores,
    policy: RetentionPolicy | None = None,
    *,
    interval: float | None = None,
    compact: bool = False,
    on_report: Callable[[SweepReport], None] | None = None,
) -> asyncio.Task[None]:
    """Start a task sweeping ``stores`` every ``interval`` seconds (default: the settings'
    ``retention.interval_seconds``) until cancelled; a failed pass is logged and retried
    at the next interval. ``compact``: each pass that removed something compacts (short
    on a sqlite file in incremental auto-vacuum mode; an older file is rewritten once).
    Cancel the task before the stores close."""
    sweeper = Sweeper.from_stores(stores)
    section = stores.settings.retention
    chosen = policy if policy is not None else RetentionPolicy.from_settings(stores.settings)
    pause = section.interval_seconds if interval is None else interval
    if not pause > 0:
        raise InvalidSaverInputError(f"interval must be a positive number of seconds, not {pause!r}")

    async def loop() -> None:
        while True:
            try:
                report = await sweeper.sweep(
                    chosen,
                    batch_size=section.batch_size,
                    claim_seconds=section.claim_seconds,
                    compact=compact,
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention sweep failed; retrying in %gs", pause)
            else:
                log.info("retention sweep: %s", report.as_dict())
                if on_report is not None:
                    on_report(report)
            await asyncio.sleep(pause)

    return asyncio.get_running_loop().create_task(loop(), name="runstore-retention-sweeper")


async def delete_thread(stores: Stores | Sweeper, thread_id: str, *, dry_run: bool = False) -> ThreadDeletion:
    """Delete one thread from every opened store, in the module docstring's order, and
    say what went (a dry run counts and changes nothing)."""
    sweeper = stores if isinstance(stores, Sweeper) else Sweeper.from_stores(stores)
    removed = await sweeper.saver.apurge_threads([thread_id], dry_run=dry_run)
    events, streams = await sweeper.cleanup([thread_id], dry_run=dry_run)
    return ThreadDeletion(thread_id, replace(removed), events, streams)
