"""The portable archive: one gzip'd JSON-lines file, streamed in and out.

Line 1 is the header ``{"format": "runstore-archive", "version": 1, ...}``; then every
saver thread's checkpoint records (parents first, one thread after another), then
every event thread's events in seq order, each run thread's runs, each store namespace's
items in key order (``{"kind": "store_item", ...}``, `runstore.store.bulk`), then
``{"kind": "end", "counts": ...}``. An archive holding the store kind is version 2 (a
runstore that reads only version 1 then says to upgrade instead of refusing a record it
does not know); one without it stays version 1. A
file without the end line was cut short and is refused. Serde payloads are
``[type tag, base64 bytes]`` exactly as the source saver's serde produced them, so an
archive of encrypted checkpoints holds them encrypted; importing it needs a
destination saver whose serde can load them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from runstore import __version__
from runstore.errors import ArchiveFormatError, ArchiveVersionError
from runstore.migrate.records import CheckpointRecord, event_from_json, event_to_json

FORMAT = "runstore-archive"
#: The newest archive format version this runstore reads (and writes when the store kind is in).
VERSION = 2
#: The version of an archive without the store kind (readable by runstores before version 2).
VERSION_WITHOUT_STORE = 1


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The archive's lines after a checked header, the end line last."""
    try:
        handle = gzip.open(path, "rt", encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise ArchiveFormatError(f"cannot open archive {path}: {exc}") from exc
    with handle:
        try:
            first = handle.readline()
            header = json.loads(first) if first else None
        except (OSError, ValueError, EOFError) as exc:
            raise ArchiveFormatError(f"{path} is not a runstore archive (a gzip'd JSON-lines file): {exc}") from exc
        check_header(header, path)
        ended = False
        try:
            for line in handle:
                entry = json.loads(line)
                if entry.get("kind") == "end":
                    ended = True
                    yield entry
                    break
                yield entry
        except (OSError, ValueError, EOFError) as exc:
            raise ArchiveFormatError(f"{path} is damaged after its header: {exc}") from exc
        if not ended:
            raise ArchiveFormatError(f"{path} ends before its end record: the export was cut short")


def check_header(header: Any, path: Path | str) -> dict[str, Any]:
    """Refuse a missing, foreign or newer header (`ArchiveFormatError`, `ArchiveVersionError`)."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ArchiveFormatError(f"{path} is not a runstore archive (its first line is no {FORMAT!r} header)")
    version = header.get("version")
    if not isinstance(version, int) or version < 1:
        raise ArchiveFormatError(f"{path}: archive version {version!r} is not a positive integer")
    if version > VERSION:
        raise ArchiveVersionError(
            f"{path} is archive format version {version}, written by runstore {header.get('runstore', '?')}; "
            f"this runstore {__version__} reads versions up to {VERSION}: upgrade runstore to import it"
        )
    return header


def read_header(path: Path) -> dict[str, Any]:
    """The archive's header, checked; every record is checked too, through to the end record."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            first = json.loads(handle.readline() or "null")
    except (OSError, ValueError, EOFError) as exc:
        raise ArchiveFormatError(f"{path} is not a runstore archive (a gzip'd JSON-lines file): {exc}") from exc
    header = check_header(first, path)
    # Every record is checked before anything is written: a bad line refuses the whole archive.
    for entry in _lines(path):
        kind = entry.get("kind")
        if kind == "checkpoint":
            CheckpointRecord.from_json(entry)
        elif kind == "event":
            event_from_json(entry)
        elif kind == "runs":
            if not isinstance(entry.get("runs"), list) or not isinstance(entry.get("thread_id"), str):
                raise ArchiveFormatError(f"{path}: a runs record lacks its thread_id or runs")
        elif kind == "store_item":
            _store_record(entry, path)
        elif kind != "end":
            raise ArchiveFormatError(
                f"{path}: a record of unknown kind {kind!r} (accepted: checkpoint, event, runs, store_item)"
            )
    return header


def _store_record(entry: dict[str, Any], path: Path) -> dict[str, Any]:
    from runstore.errors import InvalidStoreInputError
    from runstore.store.bulk import RECORD_KEYS, check_record

    try:
        return check_record({key: entry[key] for key in RECORD_KEYS if key in entry})
    except InvalidStoreInputError as exc:
        raise ArchiveFormatError(f"{path}: a store_item record is damaged: {exc}") from exc


class ArchiveSource:
    """An archive as a migration source; payloads load with the destination's serde."""

    def __init__(self, path: Path, serde: Any = None) -> None:
        self.path = path
        self.label = str(path)
        self.header = read_header(path)
        self._serde = serde

    @property
    def serde(self) -> Any:
        """The serde records load with (the destination saver's, set by the caller)."""
        return self._serde

    @serde.setter
    def serde(self, value: Any) -> None:
        self._serde = value

    async def saver_threads(self, *, updated_after: datetime | None = None) -> AsyncIterator[tuple[str, list[CheckpointRecord]]]:
        """Each saver thread of the archive with its records (``updated_after`` is ignored)."""
        current: str | None = None
        records: list[CheckpointRecord] = []
        for entry in _lines(self.path):
            if entry.get("kind") != "checkpoint":
                continue
            record = CheckpointRecord.from_json(entry)
            if record.thread_id != current and records:
                yield current, records  # type: ignore[misc]
                records = []
            current = record.thread_id
            records.append(record)
        if records and current is not None:
            yield current, records

    async def has_delta_threads(self) -> bool:
        """Whether the header says the export held delta threads."""
        return bool(self.header.get("delta_threads"))

    async def run_threads(self) -> AsyncIterator[dict[str, Any]]:
        """Each run thread of the archive as exported."""
        for entry in _lines(self.path):
            if entry.get("kind") == "runs":
                yield {key: value for key, value in entry.items() if key != "kind"}

    @property
    def store_bulk(self) -> bool:
        """Whether the exporting store kept its items' TTL state (it declared ``bulk_import``)."""
        return bool(self.header.get("store_bulk", True))

    async def store_pages(self, skip: Any = None) -> AsyncIterator[tuple[tuple[str, ...], list[dict[str, Any]]]]:
        """``(namespace, page)``: each store namespace's items in key order, pages of a
        namespace contiguous; namespaces named in ``skip`` (`namespace_name`) left out."""
        from runstore.migrate.stores import PAGE, namespace_name

        current: tuple[str, ...] | None = None
        page: list[dict[str, Any]] = []
        for entry in _lines(self.path):
            if entry.get("kind") != "store_item":
                continue
            record = _store_record(entry, self.path)
            namespace = record["namespace"]
            if page and (namespace != current or len(page) >= PAGE):
                yield current, page  # type: ignore[misc]
                page = []
            current = namespace
            if not (skip and namespace_name(namespace) in skip):
                page.append({**record, "namespace": list(namespace)})
        if page and current is not None:
            yield current, page

    async def event_pages(self, after: dict[str, int] | None = None) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        """``(thread_id, page)`` in one scan: each thread's events above ``after[thread_id]``,
        pages of a thread contiguous and in seq order."""
        from runstore.migrate.sources import EVENT_PAGE

        seen = after or {}
        current: str | None = None
        page: list[dict[str, Any]] = []
        for entry in _lines(self.path):
            if entry.get("kind") != "event":
                continue
            record = event_from_json(entry)
            thread_id = record["thread_id"]
            if page and (thread_id != current or len(page) >= EVENT_PAGE):
                yield str(current), page
                page = []
            current = thread_id
            if record["seq"] > seen.get(thread_id, 0):
                page.append(record)
        if page:
            yield str(current), page


class ArchiveWriter:
    """Writes an archive: the header, records as they come, the end line on `close`."""

    def __init__(self, path: Path, *, source: str, kinds: list[str], delta_threads: bool,
                 store_bulk: bool = True) -> None:  # fmt: skip
        self.path = path
        self.counts = {"checkpoints": 0, "events": 0, "runs": 0}
        with_store = "store" in kinds
        if with_store:
            self.counts["store_items"] = 0
        self._partial = path.with_name(path.name + ".partial")
        self._handle: IO[str] = gzip.open(self._partial, "wt", encoding="utf-8")  # noqa: SIM115
        self._line({
            "format": FORMAT, "version": VERSION if with_store else VERSION_WITHOUT_STORE,
            "runstore": __version__, "created_at": datetime.now(UTC).isoformat(), "source": source,
            "kinds": kinds, "delta_threads": delta_threads, **({"store_bulk": store_bulk} if with_store else {}),
        })  # fmt: skip

    def _line(self, entry: dict[str, Any]) -> None:
        self._handle.write(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n")

    def checkpoint(self, record: CheckpointRecord) -> None:
        """Append one checkpoint record."""
        self._line(record.to_json())
        self.counts["checkpoints"] += 1

    def event(self, record: dict[str, Any]) -> None:
        """Append one event record."""
        self._line(event_to_json(record))
        self.counts["events"] += 1

    def run_thread(self, thread: dict[str, Any]) -> None:
        """Append one thread's runs."""
        self._line({"kind": "runs", **thread})
        self.counts["runs"] += len(thread["runs"])

    def store_item(self, record: dict[str, Any]) -> None:
        """Append one store item (a `runstore.store.bulk` record)."""
        from runstore.migrate.stores import to_json

        self._line(to_json(record))
        self.counts["store_items"] += 1

    def close(self) -> None:
        """Write the end line and move the finished file into place (a cut export leaves only ``.partial``)."""
        self._line({"kind": "end", "counts": self.counts})
        self._handle.close()
        self._partial.replace(self.path)

    def abort(self) -> None:
        """Close and remove the unfinished file."""
        self._handle.close()
        self._partial.unlink(missing_ok=True)
