"""``bulk_import`` of the sqlite saver: threads exported and imported as stored rows
(`runstore.checkpoint.bulk`).

An export reads a page of threads in one snapshot; an import writes many threads in
one transaction of the group commit (`INSERT OR IGNORE`, so rows the file holds stay
as they are) and then sets each record: its times from the source, its counts, bytes,
status and metadata recomputed from the rows (`sql.REFRESH_THREAD`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from runstore.checkpoint import codec
from runstore.checkpoint.bulk import ImportedThread, ThreadRows
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.rules import checked_ids
from runstore.checkpoint.threads import THREADS

from . import ops, sql

_IDS = "SELECT value FROM json_each(?)"
_EXPORT_THREADS = (
    f"SELECT thread_id, created_at, updated_at, touched_at, retention, fence FROM {THREADS} "
    f"WHERE thread_id IN ({_IDS}) AND {sql.LIVE_THREAD}"
)
_EXPORT_CHECKPOINTS = f"SELECT {', '.join(sql.CHECKPOINT_COLUMNS)} FROM {CHECKPOINTS} WHERE thread_id IN ({_IDS})"
_EXPORT_BLOBS = f"SELECT {', '.join(codec.BlobRow._fields)} FROM {BLOBS} WHERE thread_id IN ({_IDS})"
_EXPORT_WRITES = f"SELECT {', '.join(codec.WriteRow._fields)} FROM {WRITES} WHERE thread_id IN ({_IDS})"
_HELD = f"SELECT DISTINCT thread_id FROM {CHECKPOINTS} WHERE thread_id IN ({_IDS})"
_INSERT_BLOB = sql.INSERT_BLOB.replace("INSERT OR REPLACE", "INSERT OR IGNORE")
# The source's times and retention overrides; a tombstone is revived (importing is
# deliberate, as a copy is) and the fence only rises.
_IMPORT_THREAD = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, retention, fence)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = excluded.created_at, updated_at = excluded.updated_at,
    touched_at = excluded.touched_at, retention = coalesce(excluded.retention, retention),
    fence = max(fence, excluded.fence), deleted_at = NULL
"""


def export_rows(conn: sqlite3.Connection, thread_ids: Sequence[str]) -> list[ThreadRows]:
    """The live threads among ``thread_ids`` with every stored row, in one snapshot."""
    ids = codec.dump_json(list(thread_ids))

    def body() -> list[ThreadRows]:
        threads = {row[0]: ThreadRows(*row) for row in conn.execute(_EXPORT_THREADS, (ids,))}
        for statement, part in ((_EXPORT_CHECKPOINTS, "checkpoints"), (_EXPORT_BLOBS, "blobs"),
                                (_EXPORT_WRITES, "writes")):  # fmt: skip
            for row in conn.execute(statement, (ids,)):
                held = threads.get(row[0])
                if held is not None:
                    getattr(held, part).append(tuple(row))
        return [threads[t] for t in thread_ids if t in threads]

    return ops.read_tx(conn, body)


def held_ids(conn: sqlite3.Connection, thread_ids: Sequence[str]) -> set[str]:
    """Which of ``thread_ids`` hold a checkpoint."""
    return {row[0] for row in conn.execute(_HELD, (codec.dump_json(list(thread_ids)),))}


def _inserted(conn: sqlite3.Connection, statement: str, rows: list[tuple[Any, ...]]) -> int:
    if not rows:
        return 0
    before = conn.total_changes
    conn.executemany(statement, rows)
    return conn.total_changes - before


def import_rows(conn: sqlite3.Connection, threads: Sequence[ThreadRows]) -> list[ImportedThread]:
    """Insert what the file lacks of each thread and set its record (inside `ops.write_batch`)."""
    out = []
    for rows in threads:
        checkpoints = _inserted(conn, sql.INSERT_CHECKPOINT, rows.checkpoints)
        _inserted(conn, _INSERT_BLOB, rows.blobs)
        writes = _inserted(conn, sql.INSERT_WRITE_FIRST, rows.writes)
        conn.execute(_IMPORT_THREAD, (rows.thread_id, rows.created_at, rows.updated_at, rows.touched_at,
                                      rows.retention, rows.fence))  # fmt: skip
        conn.execute(sql.REFRESH_THREAD, {"thread_id": rows.thread_id})
        out.append(ImportedThread(rows.thread_id, checkpoints, writes))
    return out


class SqliteBulkRows:
    """`runstore.checkpoint.bulk.BulkSaver` on `SqliteSaver` (its ``_read``/``_write``)."""

    _read: Callable[..., Any]
    _write: Callable[..., Any]

    async def aexport_thread_rows(self, thread_ids: Sequence[str]) -> list[ThreadRows]:
        """The live threads among ``thread_ids`` as stored (one read; absent ids left out)."""
        rows: list[ThreadRows] = await self._read(export_rows, checked_ids(thread_ids, "thread_ids"))
        return rows

    async def aheld_thread_ids(self, thread_ids: Sequence[str]) -> set[str]:
        """Which of ``thread_ids`` hold a checkpoint here."""
        held: set[str] = await self._read(held_ids, checked_ids(thread_ids, "thread_ids"))
        return held

    async def aimport_thread_rows(self, threads: Sequence[ThreadRows]) -> list[ImportedThread]:
        """Insert the rows this file lacks, in one transaction, and set each thread's record."""
        if not threads:
            return []
        checked_ids([t.thread_id for t in threads], "thread_ids")
        done: list[ImportedThread] = await self._write(import_rows, list(threads))
        return done
