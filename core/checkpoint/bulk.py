"""``bulk_import`` for savers: threads read and written as the SQL savers store their rows.

A runstore SQL saver that declares ``bulk_import`` implements `BulkSaver`: it exports
threads as their stored rows (`ThreadRows`: the checkpoint, blob and write rows of
`runstore.checkpoint.codec` plus the thread record's times) and imports many threads
in one transaction, insert-if-absent, setting each thread's record from its rows and
the source's times. `runstore migrate` uses it when both savers declare it and share a
serde, so nothing is deserialized or re-encoded on the way; any other pair goes
through ``aput``/``aput_writes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["BulkSaver", "ImportedThread", "ThreadRows", "rows_bytes"]


@dataclass
class ThreadRows:
    """One thread as stored: rows in `codec` column order, times in microseconds.

    ``checkpoints`` are `codec.CheckpointRow` fields followed by the row's ``created_at``;
    ``retention`` is the record's overrides as JSON text (or ``None``); ``fence`` the
    thread's fencing counter.
    """

    thread_id: str
    created_at: int
    updated_at: int
    touched_at: int
    retention: str | None = None
    fence: int = 0
    checkpoints: list[tuple[Any, ...]] = field(default_factory=list)
    blobs: list[tuple[Any, ...]] = field(default_factory=list)
    writes: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class ImportedThread:
    """What an import added to one thread (rows already held are not counted)."""

    thread_id: str
    checkpoints: int
    writes: int


def rows_bytes(rows: ThreadRows) -> int:
    """The payload bytes of a thread's rows (checkpoint, metadata, blobs, writes)."""
    size = sum(len(row[6]) + len(row[7]) for row in rows.checkpoints)
    size += sum(len(row[5] or b"") for row in rows.blobs)
    return size + sum(len(row[8] or b"") for row in rows.writes)


@runtime_checkable
class BulkSaver(Protocol):
    """``bulk_import`` on a saver: threads exported and imported as stored rows."""

    async def aexport_thread_rows(self, thread_ids: Sequence[str]) -> list[ThreadRows]:
        """The live threads among ``thread_ids`` as stored (one read; absent ids left out)."""
        ...

    async def aheld_thread_ids(self, thread_ids: Sequence[str]) -> set[str]:
        """Which of ``thread_ids`` hold a checkpoint here."""
        ...

    async def aimport_thread_rows(self, threads: Sequence[ThreadRows]) -> list[ImportedThread]:
        """Insert the rows this saver lacks, in one transaction, and set each thread's
        record: counts, status and metadata from its rows, times as given."""
        ...
