"""One migration pass: checks that write nothing, the copy, the ledger, the verify.

`migrate` takes a source (`LiveSource` or `ArchiveSource`) and a destination
`Endpoint`. Before writing it refuses what cannot work (a kind one side lacks, delta
threads into a full-mode destination, destination threads whose content differs with
``on_conflict="fail"``), so a refused migration writes nothing. The copy is
insert-if-absent per checkpoint and per event seq, and the ledger records finished
threads: a rerun after a kill continues, a rerun after a finished pass copies only what
changed since that pass started (the watermark), and a finished migration copies nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from runstore.errors import (
    ActiveRunsError,
    KindNotServedError,
    MigrationConflictError,
    MigrationModeError,
)
from runstore.events.bulk import BulkEventStore
from runstore.migrate.digest import events_digest, saver_digest, saver_thread_digest
from runstore.migrate.endpoints import Endpoint
from runstore.migrate.fingerprints import fingerprint
from runstore.migrate.ledger import Ledger
from runstore.migrate.records import CheckpointRecord
from runstore.migrate.savers import (
    bulk_pair,
    copy_bulk,
    held_checkpoints,
    read_thread,
    thread_ids,
    write_record,
)

OnConflict = Literal["fail", "skip", "overwrite"]
#: How far before a pass's start the next pass looks for changed threads (clock skew
#: between the source's clock and this process's; copying twice is harmless).
WATERMARK_MARGIN = timedelta(minutes=5)
Progress = Callable[[str, int, int], None]


@dataclass
class KindCounts:
    """What a pass did for one kind."""

    threads: int = 0
    copied: int = 0
    present: int = 0
    writes: int = 0
    bytes: int = 0
    conflicts: list[str] = field(default_factory=list)


@dataclass
class MigrationReport:
    """The outcome of `migrate`: counts per kind, the pass, the verify."""

    source: str
    destination: str
    kinds: list[str]
    dry_run: bool
    pass_kind: str
    pass_number: int
    counts: dict[str, KindCounts]
    seconds: float = 0.0
    verified: bool = False
    mismatches: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        out = asdict(self)
        out["ok"] = not any(self.mismatches.values())
        return out


@dataclass
class MigrateOptions:
    """What `migrate` is asked to do."""

    kinds: tuple[str, ...]
    dry_run: bool = False
    on_conflict: OnConflict = "fail"
    verify: bool = True
    #: The checkpoint channel mode the destination is run in.
    destination_mode: str = "full"
    ledger: Path | None = None
    progress: Progress | None = None
    #: Copy running (leased) runs as orphaned instead of refusing the migration.
    include_active: bool = False
    #: Saver threads copied at once (their writes share the destination's group commits).
    concurrency: int = 8
    #: How far before the last pass's start a catch-up looks (the writers' clock skew).
    watermark_margin: timedelta = WATERMARK_MARGIN
    #: The destination store's index config (LangGraph ``IndexConfig``): copied items are
    #: embedded with it as they are written. ``None``: they carry no vectors.
    store_index: Any = None
    #: Runstore settings both sides open with (``None``: the defaults).
    settings: Mapping[str, Any] | None = None


def check_kinds(source: Any, destination: Endpoint, kinds: tuple[str, ...]) -> None:
    """Refuse a kind one side lacks, events without ``bulk_import``, a stock saver as destination."""
    for kind in kinds:
        if isinstance(source, Endpoint) and not source.has(kind):
            raise KindNotServedError(f"the source {source.label} has no {kind} store; choose --kinds")
        if not destination.has(kind):
            raise KindNotServedError(f"the destination {destination.label} has no {kind} store; choose --kinds")
    if "events" in kinds:
        for side, store in (("source", getattr(getattr(source, "endpoint", None), "events", None)),
                            ("destination", destination.events)):  # fmt: skip
            if store is not None and not isinstance(store, BulkEventStore):
                raise KindNotServedError(
                    f"the {side} event store {type(store).__name__} does not declare bulk_import "
                    "(aexport_thread_ids, aexport_events, aimport_events): its feeds cannot be copied with their "
                    "seqs, and renumbering them would break the cursors clients hold; leave events out with --kinds"
                )
    if "runs" in kinds:
        for side, store in (("source", getattr(getattr(source, "endpoint", None), "runs", None)),
                            ("destination", destination.runs)):  # fmt: skip
            if store is not None and not hasattr(store, "aimport_runs"):
                raise KindNotServedError(
                    f"the {side} run store {type(store).__name__} does not declare bulk_import "
                    "(aexport_run_thread_ids, aexport_runs, aimport_runs); leave runs out with --kinds"
                )
    if destination.stock and destination is not getattr(source, "endpoint", None):
        raise KindNotServedError(f"{destination.label} is a LangGraph stock saver: migrate reads it, never writes it")


async def check_mode(source: Any, options: MigrateOptions) -> None:
    """Refuse delta threads into a full-mode destination (`MigrationModeError`)."""
    if "saver" in options.kinds and options.destination_mode == "full" and await source.has_delta_threads():
        raise MigrationModeError(
            f"the source {source.label} holds delta-mode threads, but the destination is run in full mode: "
            "a full-mode process refuses delta threads, and turning them into full threads would need every "
            "checkpoint's messages materialized (and their delta history would be gone). Run the destination "
            "in delta mode (checkpoint_channel_mode: delta, the same snapshot_frequency) and pass --mode delta. "
            "The other way round is allowed: full-mode threads copied into a delta-mode destination stay full "
            "and a delta-mode process reads them (docs/checkpoint-modes.md)"
        )


def _saver_conflict(records: list[CheckpointRecord], held: dict[tuple[str, str], str], serde: Any) -> bool:
    wanted = {(r.checkpoint_ns, r.checkpoint_id): fingerprint(r, serde) for r in records}
    return any(wanted.get(key) != fp for key, fp in held.items())


async def _events_conflict(store: Any, thread_id: str, page: list[dict[str, Any]], after: int) -> bool:
    """Whether the destination holds, in ``(after, last seq of the page]``, a seq the page
    lacks or holds with other content."""
    last = page[-1]["seq"]
    held = await store.aexport_events(thread_id, after_seq=after, limit=len(page) + 1)
    held = [h for h in held if h["seq"] <= last]
    by_seq = {record["seq"]: record for record in page}
    return any(
        h["seq"] not in by_seq or events_digest([h]) != events_digest([by_seq[h["seq"]]]) for h in held
    )


async def _prescan(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                   counts: dict[str, KindCounts], updated_after: datetime | None) -> None:  # fmt: skip
    """Find conflicting threads before anything is written (fail mode and dry runs)."""
    if "saver" in options.kinds:
        from runstore.migrate.savers import thread_ids

        held_ids = {t async for t in thread_ids(destination.saver)}
        ours = ledger.written.get("saver", set())
        if held_ids:
            async for thread_id, records in source.saver_threads(updated_after=updated_after):
                if thread_id in held_ids and thread_id not in ours:
                    held = await held_checkpoints(destination.saver, thread_id)
                    if _saver_conflict(records, held, source.serde):
                        counts["saver"].conflicts.append(thread_id)
    if "runs" in options.kinds:
        async for exported in source.run_threads():
            held = await destination.runs.aexport_runs(exported["thread_id"])
            if held["runs"] and _runs_conflict(orphaned(exported), held):
                counts["runs"].conflicts.append(exported["thread_id"])
    if "events" in options.kinds:
        counts["events"].conflicts.extend(await _event_conflicts(source, destination, ledger))
    if "store" in options.kinds:
        from runstore.migrate import stores

        skip = ledger.done.get("store")
        await stores.prescan(source.store_pages(skip), stores.StoreSide(destination.store), counts["store"],
                             dry_run=options.dry_run)  # fmt: skip


async def _event_conflicts(source: Any, destination: Endpoint, ledger: Ledger) -> list[str]:
    """The event threads whose destination feed differs from the source's (ascending)."""
    flagged: set[str] = set()
    last: dict[str, int] = dict(ledger.event_seqs)
    async for thread_id, page in source.event_pages(ledger.event_seqs):
        after = last.get(thread_id, 0)
        last[thread_id] = page[-1]["seq"]
        if thread_id not in flagged and await _events_conflict(destination.events, thread_id, page, after):
            flagged.add(thread_id)
    return sorted(flagged)


async def _paged_conflicts(source: Any, destination: Endpoint, options: MigrateOptions,
                           ledger: Ledger) -> dict[str, set[str]]:  # fmt: skip
    """Under ``skip`` and ``overwrite``, the event threads and store namespaces in conflict,
    found before any is written: both are copied page by page, and a conflict first seen on
    a later page must neither leave the earlier pages copied (skip) nor delete them after
    they were written (overwrite)."""
    found: dict[str, set[str]] = {}
    if "events" in options.kinds:
        found["events"] = set(await _event_conflicts(source, destination, ledger))
    if "store" in options.kinds:
        from runstore.migrate import stores

        seen = KindCounts()
        await stores.prescan(source.store_pages(ledger.done.get("store")), stores.StoreSide(destination.store),
                             seen, dry_run=False)  # fmt: skip
        found["store"] = set(seen.conflicts)
    return found


async def migrate(source: Any, destination: Endpoint, options: MigrateOptions) -> MigrationReport:
    """Copy ``options.kinds`` from ``source`` to ``destination``; see the module docstring."""
    started = time.monotonic()
    check_kinds(source, destination, options.kinds)
    await check_mode(source, options)
    if "runs" in options.kinds and not options.include_active:
        running = [run["run_id"] async for thread in source.run_threads() for run in thread["runs"]
                   if run["status"] == "running"]  # fmt: skip
        if running:
            raise ActiveRunsError(running)
    ledger = Ledger.load(None if options.dry_run else options.ledger)
    if options.dry_run and options.ledger is not None:
        ledger = Ledger.load(options.ledger)
        ledger.path = None
    pass_kind = "resume" if ledger.resuming else ("catch-up" if ledger.watermark else "copy")
    updated_after = None
    if ledger.watermark and not ledger.resuming:
        updated_after = datetime.fromisoformat(ledger.watermark) - options.watermark_margin
    counts = {kind: KindCounts() for kind in options.kinds}
    report = MigrationReport(
        source.label, destination.label, list(options.kinds), options.dry_run, pass_kind,
        ledger.passes + (0 if ledger.resuming else 1), counts,
    )  # fmt: skip
    if "store" in options.kinds:
        report.notes.extend(_store_notes(source, destination))
    if options.on_conflict == "fail" or options.dry_run:
        await _prescan(source, destination, options, ledger, counts, updated_after)
        conflicted = {kind: c.conflicts for kind, c in counts.items() if c.conflicts}
        if conflicted and not options.dry_run:
            kind, ids = next(iter(conflicted.items()))
            raise MigrationConflictError(kind, ids)
    if options.dry_run:
        await _dry_counts(source, destination, options, ledger, counts, updated_after)
        report.seconds = time.monotonic() - started
        return report
    decided = {} if options.on_conflict == "fail" else await _paged_conflicts(source, destination, options, ledger)
    pass_start = datetime.now(UTC)
    ledger.start_pass(pass_start)
    try:
        if "saver" in options.kinds:
            await _copy_saver(source, destination, options, ledger, counts["saver"], updated_after)
        if "events" in options.kinds:
            await _copy_events(source, destination, options, ledger, counts["events"], decided.get("events"))
        if "runs" in options.kinds:
            await _copy_runs(source, destination, options, ledger, counts["runs"])
        if "store" in options.kinds:
            from runstore.migrate import stores

            await stores.copy(source.store_pages(ledger.done.get("store")), stores.StoreSide(destination.store),
                              options.on_conflict, ledger, counts["store"], options.progress,
                              conflicted=decided.get("store"))  # fmt: skip
        ledger.end_pass(datetime.now(UTC), pass_start)
    finally:
        ledger.close()
    if options.verify:
        report.mismatches = await verify(source, destination, options.kinds, skip=counts)
        report.verified = True
    report.seconds = time.monotonic() - started
    return report


async def _copy_saver(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                      counts: KindCounts, updated_after: datetime | None) -> None:  # fmt: skip
    """Copy saver threads: as stored rows when both savers declare ``bulk_import``
    (`copy_bulk`), else ``options.concurrency`` at a time (a thread's checkpoints in
    order), whose writes share the destination's group commits."""
    reader: Any = getattr(getattr(source, "endpoint", None), "saver", None)
    pair = None if reader is None else bulk_pair(reader, destination.saver)
    if pair is not None:  # both declare bulk_import: rows copied as stored
        async def fallback(thread_id: str) -> bool:
            records = await read_thread(reader, thread_id)
            await _copy_saver_thread(source, destination, options, ledger, counts, thread_id, records)
            return thread_id not in counts.conflicts or options.on_conflict == "overwrite"

        ids = thread_ids(reader, updated_after=updated_after)
        await copy_bulk(pair, ids, ledger, counts, options.progress, fallback)
        return
    done = ledger.done.get("saver", {})
    queue: asyncio.Queue[tuple[str, list[CheckpointRecord]] | None] = asyncio.Queue(maxsize=options.concurrency)

    async def work() -> None:
        while (item := await queue.get()) is not None:
            await _copy_saver_thread(source, destination, options, ledger, counts, *item)

    async with asyncio.TaskGroup() as group:
        for _ in range(options.concurrency):
            group.create_task(work())
        # A worker's failure cancels this loop (the task group), and the others with it.
        async for thread_id, records in source.saver_threads(updated_after=updated_after):
            if thread_id not in done:
                counts.threads += 1
                await queue.put((thread_id, records))
        for _ in range(options.concurrency):
            await queue.put(None)


async def _copy_saver_thread(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                             counts: KindCounts, thread_id: str, records: list[CheckpointRecord]) -> None:  # fmt: skip
    saver = destination.saver
    ours = ledger.written.get("saver", set())
    held = await held_checkpoints(saver, thread_id)
    if held and thread_id not in ours and _saver_conflict(records, held, source.serde):
        if options.on_conflict == "skip":
            counts.conflicts.append(thread_id)
            return
        if options.on_conflict == "fail":  # appeared after the prescan: a concurrent writer
            raise MigrationConflictError("saver", [thread_id])
        counts.conflicts.append(thread_id)
        ledger.begin("saver", thread_id)
        await saver.adelete_thread(thread_id)
        held = {}
    else:
        ledger.begin("saver", thread_id)
    for record in records:
        key = (record.checkpoint_ns, record.checkpoint_id)
        if key in held and held[key] == fingerprint(record, source.serde):
            counts.present += 1
            continue
        await write_record(saver, record, source.serde)
        counts.copied += 1
        counts.writes += len(record.writes)
        counts.bytes += _size(record)
        if options.progress is not None:
            options.progress("saver", counts.threads, counts.copied)
    ledger.finish("saver", thread_id)


def orphaned(thread: dict[str, Any]) -> dict[str, Any]:
    """The thread's runs with every running run's lease long expired (``--include-active``):
    the destination's recovery (`RunStore.claim_expired`) then ends them."""
    runs = [{**run, "lease_expires_at": 1} if run["status"] == "running" else run for run in thread["runs"]]
    return {**thread, "runs": runs}


def _runs_conflict(thread: dict[str, Any], held: dict[str, Any]) -> bool:
    wanted = {run["run_id"]: run for run in thread["runs"]}
    return any(run["run_id"] not in wanted or wanted[run["run_id"]] != run for run in held["runs"])


async def _copy_runs(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                     counts: KindCounts) -> None:  # fmt: skip
    store = destination.runs
    done = ledger.done.get("runs", {})
    async for exported in source.run_threads():
        thread = orphaned(exported)
        thread_id = thread["thread_id"]
        if thread_id in done:
            continue
        counts.threads += 1
        held = await store.aexport_runs(thread_id)
        if held["runs"] and _runs_conflict(thread, held):
            if options.on_conflict == "skip":
                counts.conflicts.append(thread_id)
                continue
            if options.on_conflict == "fail":
                raise MigrationConflictError("runs", [thread_id])
            counts.conflicts.append(thread_id)
            for run in held["runs"]:
                await store.delete(run["run_id"])
        ledger.begin("runs", thread_id)
        inserted = await store.aimport_runs([thread])
        counts.copied += inserted
        counts.present += len(thread["runs"]) - inserted
        if options.progress is not None:
            options.progress("runs", counts.threads, counts.copied)
        ledger.finish("runs", thread_id)


def _size(record: CheckpointRecord) -> int:
    blobs = [record.checkpoint, record.metadata, *record.values.values(), *(w.value for w in record.writes)]
    return sum(len(blob.data) for blob in blobs)


async def _copy_events(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                       counts: KindCounts, conflicted: set[str] | None = None) -> None:  # fmt: skip
    """Copy event feeds page by page; a feed in ``conflicted`` (found before any write) is
    left whole (skip) or replaced whole (overwrite)."""
    store = destination.events
    current: str | None = None
    last_seq = 0
    async for thread_id, page in source.event_pages(dict(ledger.event_seqs)):
        if thread_id != current:
            if current is not None:
                ledger.finish("events", current, last_seq)
            current, last_seq = thread_id, ledger.event_seqs.get(thread_id, 0)
            counts.threads += 1
            ledger.begin("events", thread_id)
            if conflicted and thread_id in conflicted:
                counts.conflicts.append(thread_id)
                if options.on_conflict == "overwrite":
                    await store.delete_by_thread(thread_id, user_id=None)
        if options.on_conflict == "skip" and conflicted and thread_id in conflicted:
            last_seq = page[-1]["seq"]
            continue
        inserted = await store.aimport_events(page)
        counts.copied += inserted
        counts.present += len(page) - inserted
        last_seq = page[-1]["seq"]
        if options.progress is not None:
            options.progress("events", counts.threads, counts.copied)
    if current is not None:
        ledger.finish("events", current, last_seq)


async def _dry_counts(source: Any, destination: Endpoint, options: MigrateOptions, ledger: Ledger,
                      counts: dict[str, KindCounts], updated_after: datetime | None) -> None:  # fmt: skip
    """What a real pass would copy (nothing is written)."""
    if "runs" in options.kinds:
        async for exported in source.run_threads():
            ids = {run["run_id"] for run in (await destination.runs.aexport_runs(exported["thread_id"]))["runs"]}
            counts["runs"].threads += 1
            counts["runs"].present += sum(1 for run in exported["runs"] if run["run_id"] in ids)
            counts["runs"].copied += sum(1 for run in exported["runs"] if run["run_id"] not in ids)
    if "saver" in options.kinds:
        done = ledger.done.get("saver", {})
        async for thread_id, records in source.saver_threads(updated_after=updated_after):
            if thread_id in done:
                continue
            counts["saver"].threads += 1
            held = await held_checkpoints(destination.saver, thread_id)
            for record in records:
                if held.get((record.checkpoint_ns, record.checkpoint_id)) == fingerprint(record, source.serde):
                    counts["saver"].present += 1
                else:
                    counts["saver"].copied += 1
                    counts["saver"].writes += len(record.writes)
                    counts["saver"].bytes += _size(record)
    if "events" in options.kinds:
        threads: set[str] = set()
        async for thread_id, page in source.event_pages(dict(ledger.event_seqs)):
            threads.add(thread_id)
            held = await destination.events.aexport_events(thread_id, after_seq=page[0]["seq"] - 1, limit=len(page))
            present = {h["seq"] for h in held}
            counts["events"].present += sum(1 for r in page if r["seq"] in present)
            counts["events"].copied += sum(1 for r in page if r["seq"] not in present)
        counts["events"].threads = len(threads)


async def verify(source: Any, destination: Endpoint, kinds: tuple[str, ...] | list[str],
                 skip: dict[str, KindCounts] | None = None) -> dict[str, list[str]]:  # fmt: skip
    """Thread ids whose digest differs between ``source`` and ``destination``, per kind
    (threads a pass skipped as conflicting are left out)."""
    skipped = {kind: set(c.conflicts) for kind, c in (skip or {}).items()}
    mismatches: dict[str, list[str]] = {}
    if "saver" in kinds:
        bad = []
        # An archive has no delta walk of its own: against one, the stored history is compared.
        live = getattr(source, "endpoint", None) is not None
        async for thread_id, records in source.saver_threads():
            if thread_id in skipped.get("saver", set()):
                continue
            mine = saver_thread_digest(records, source.serde, await _source_history(source, records))
            if mine != await saver_digest(destination.saver, thread_id, with_history=live):
                bad.append(thread_id)
        mismatches["saver"] = bad
    if "runs" in kinds:
        from runstore.migrate.fingerprints import canonical

        bad_runs = []
        async for exported in source.run_threads():
            thread_id = exported["thread_id"]
            if thread_id in skipped.get("runs", set()):
                continue
            held = await destination.runs.aexport_runs(thread_id)
            if canonical(orphaned(exported)) != canonical(held):
                bad_runs.append(thread_id)
        mismatches["runs"] = bad_runs
    if "events" in kinds:
        from runstore.migrate.digest import EventDigest

        current: str | None = None
        bad_events: set[str] = set()
        mine_digest = EventDigest()
        async for thread_id, page in source.event_pages():
            if thread_id != current:
                if current is not None and not await _same_feed(destination, current, mine_digest):
                    bad_events.add(current)
                current, mine_digest = thread_id, EventDigest()
            mine_digest.update(page)
        if current is not None and not await _same_feed(destination, current, mine_digest):
            bad_events.add(current)
        mismatches["events"] = sorted(bad_events - skipped.get("events", set()))
    if "store" in kinds:
        from runstore.migrate import stores

        held = stores.StoreSide(destination.store)
        mismatches["store"] = await stores.verify(source.store_pages(), held, times=held.native,
                                                  ttl=held.native and source.store_bulk,
                                                  skip=skipped.get("store", set()))  # fmt: skip
    return mismatches


def _store_notes(source: Any, destination: Endpoint) -> list[str]:
    """What a copy of the store kind cannot keep, said in the report."""
    from runstore.migrate.stores import StoreSide

    notes = []
    if not source.store_bulk:
        notes.append(f"the source store of {source.label} does not declare bulk_import: its items' TTLs cannot "
                     "be read through BaseStore, so they are copied without expiry")  # fmt: skip
    if not StoreSide(destination.store).native:
        notes.append(f"the destination store {type(destination.store).__name__} does not declare bulk_import: "
                     "items are written with BaseStore puts, so their created_at/updated_at become the copy's "
                     "time and their TTL restarts from it")  # fmt: skip
    return notes


async def _same_feed(destination: Endpoint, thread_id: str, expected: Any) -> bool:
    from runstore.migrate.digest import EventDigest

    held = EventDigest()
    after = 0
    while True:
        page = await destination.events.aexport_events(thread_id, after_seq=after, limit=500)
        if page:
            held.update([dict(r) for r in page])
            after = page[-1]["seq"]
        if len(page) < 500:
            break
    return bool(held.hexdigest() == expected.hexdigest())


async def _source_history(source: Any, records: list[CheckpointRecord]) -> dict[str, Any]:
    """The delta history of the source's heads: asked of a live saver, else computed by the
    destination (an archive has no walk of its own, so its records stand for themselves)."""
    from runstore.migrate.digest import delta_history

    endpoint = getattr(source, "endpoint", None)
    if endpoint is None or endpoint.saver is None:
        return {}
    return await delta_history(endpoint.saver, records)
