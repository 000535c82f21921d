"""The three operations the commands run: migrate URL to URL, export to an archive,
import an archive, each opening its sides and closing them again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runstore.errors import KindNotServedError, SameBackendError
from runstore.migrate.archive import ArchiveSource, ArchiveWriter
from runstore.migrate.endpoints import KINDS, Endpoint, open_endpoint, same_place, served_kinds
from runstore.migrate.engine import (
    MigrateOptions,
    MigrationReport,
    check_kinds,
    check_mode,
    migrate,
)
from runstore.migrate.ledger import default_path
from runstore.migrate.sources import LiveSource
from runstore.redaction import redact


def _kinds(wanted: Sequence[str] | None, *served: Sequence[str]) -> tuple[str, ...]:
    for kind in wanted or ():
        if kind not in KINDS:
            raise KindNotServedError(
                f"--kinds {kind!r} is not a kind migrate moves; accepted: {', '.join(KINDS)} (stream bridges are "
                "not migrated: live streams are transient, docs/migrate.md)"
            )
    common = [kind for kind in KINDS if all(kind in s for s in served)]
    if wanted:
        return tuple(kind for kind in KINDS if kind in wanted)
    if not common:
        raise KindNotServedError(f"the two sides share no kind migrate moves ({', '.join(KINDS)})")
    return tuple(common)


def _missing_file(url: str) -> bool:
    from runstore.urls import BackendURL

    parsed = BackendURL.parse(url)
    path = parsed.file_path() if parsed.scheme == "sqlite" else None
    return path is not None and not path.exists()


async def run_migrate(source: str, destination: str, options: MigrateOptions, kinds: Sequence[str] | None) -> MigrationReport:
    """``runstore migrate SOURCE DESTINATION``."""
    if same_place(source, destination):
        raise SameBackendError(
            f"source and destination are the same store ({redact(destination)}); name two different backends"
        )
    options.kinds = _kinds(kinds, served_kinds(source), served_kinds(destination))
    if options.ledger is None:
        options.ledger = default_path(source, destination)
    # Opened the way runstore.open opens it: a kind never written gets its empty tables.
    async with open_endpoint(source, options.kinds, settings=options.settings) as src:
        # Refusals the source alone decides come before the destination is opened (or created).
        await check_mode(LiveSource(src), options)
        # A dry run against a sqlite file that does not exist yet compares with an empty
        # store instead of creating the file.
        target = "memory://" if options.dry_run and _missing_file(destination) else destination
        async with open_endpoint(target, options.kinds, create=not options.dry_run or target != destination,
                                 store_index=options.store_index, settings=options.settings) as dst:  # fmt: skip
            dst.label = destination
            return await migrate(LiveSource(src), dst, options)


async def run_export(url: str, path: Path, kinds: Sequence[str] | None) -> dict[str, Any]:
    """``runstore export URL -o FILE``: every record of ``kinds`` into one archive."""
    chosen = _kinds(kinds, served_kinds(url))
    async with open_endpoint(url, chosen) as endpoint:
        return await export(endpoint, path, chosen)


async def export(endpoint: Endpoint, path: Path, kinds: Sequence[str]) -> dict[str, Any]:
    """Write ``kinds`` of an open endpoint into the archive ``path`` (its saver's serde
    produced the payloads, which are archived as they are)."""
    chosen = tuple(kinds)
    source = LiveSource(endpoint)
    check_kinds(source, endpoint, chosen)  # the same refusals as a migration's
    delta = "saver" in chosen and await source.has_delta_threads()
    store_bulk = "store" in chosen and source.store_bulk
    writer = ArchiveWriter(path, source=redact(endpoint.label), kinds=list(chosen), delta_threads=delta,
                           store_bulk=store_bulk)  # fmt: skip
    threads = dict.fromkeys(chosen, 0)
    try:
        if "saver" in chosen:
            async for _, records in source.saver_threads():
                threads["saver"] += 1
                for record in records:
                    writer.checkpoint(record)
        if "events" in chosen:
            last = None
            async for thread_id, page in source.event_pages():
                threads["events"] += thread_id != last
                last = thread_id
                for event in page:
                    writer.event(event)
        if "runs" in chosen:
            async for thread in source.run_threads():
                threads["runs"] += 1
                writer.run_thread(thread)
        if "store" in chosen:
            last_ns = None
            async for namespace, items in source.store_pages():
                threads["store"] += namespace != last_ns
                last_ns = namespace
                for item in items:
                    writer.store_item(item)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return {"archive": str(path), "kinds": list(chosen), "threads": threads, **writer.counts}


async def run_import(path: Path, url: str, options: MigrateOptions, kinds: Sequence[str] | None) -> MigrationReport:
    """``runstore import FILE URL``: an archive into a backend, verified against the archive
    (give ``path`` absolute: the default ledger is keyed by it)."""
    archive = ArchiveSource(path)
    options.kinds = _kinds(kinds, archive.header.get("kinds", []), served_kinds(url))
    if options.ledger is None:
        options.ledger = default_path(str(path), url)
    await check_mode(archive, options)
    async with open_endpoint(url, options.kinds, store_index=options.store_index) as dst:
        if dst.saver is not None:
            archive.serde = dst.saver.serde
        return await migrate(archive, dst, options)
