"""``bulk_import`` of the PostgreSQL saver: threads exported and imported as stored rows
(`runstore.checkpoint.bulk`), as `BulkRows`, a base class of `PostgresSaver`.

An import of many threads is one transaction of four statements whatever its size: each
table's rows go in as arrays (``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
NOTHING``: one round trip, no temporary table, so it works behind a transaction
pooler too), then the records take the source's times and are recomputed from the rows
(``REFRESH_THREAD_SQL`` for each thread, pipelined by ``executemany``). JSON columns
leave an export as runstore's canonical text (`codec.dump_json`), as the sqlite saver
stores them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from runstore.checkpoint import codec
from runstore.checkpoint.bulk import ImportedThread, ThreadRows
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.prefetch import PrefetchStore
from runstore.checkpoint.rules import checked_ids
from runstore.checkpoint.threads import THREADS

from . import thread_sql
from .connections import PostgresCalls

_LIVE = "deleted_at IS NULL AND checkpoints > 0"
EXPORT_THREADS_SQL = (
    f"SELECT thread_id, created_at, updated_at, touched_at, retention::text, fence FROM {THREADS} "
    f"WHERE thread_id = ANY($1::text[]) AND {_LIVE}"
)
EXPORT_CHECKPOINTS_SQL = f"""
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint,
       metadata::text, value_versions::text, channel_versions::text, created_at
FROM {CHECKPOINTS} WHERE thread_id = ANY($1::text[])
"""
EXPORT_BLOBS_SQL = (
    f"SELECT {', '.join(codec.BlobRow._fields)} FROM {BLOBS} WHERE thread_id = ANY($1::text[])"
)
EXPORT_WRITES_SQL = (
    f"SELECT {', '.join(codec.WriteRow._fields)} FROM {WRITES} WHERE thread_id = ANY($1::text[])"
)
HELD_SQL = f"SELECT DISTINCT thread_id FROM {CHECKPOINTS} WHERE thread_id = ANY($1::text[])"
IMPORT_CHECKPOINTS_SQL = f"""
INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
                           type, checkpoint, metadata, value_versions, channel_versions, created_at)
SELECT t, n, c, p, r, ty, ck, m::jsonb, vv::jsonb, cv::jsonb, ca
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[],
            $8::text[], $9::text[], $10::text[], $11::bigint[]) AS x(t, n, c, p, r, ty, ck, m, vv, cv, ca)
ON CONFLICT DO NOTHING
RETURNING thread_id
"""
IMPORT_BLOBS_SQL = f"""
INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
ON CONFLICT DO NOTHING
"""
IMPORT_WRITES_SQL = f"""
INSERT INTO {WRITES} (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel,
                      type, blob)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[],
                     $7::text[], $8::text[], $9::bytea[])
ON CONFLICT DO NOTHING
RETURNING thread_id
"""
# The source's times and retention overrides; a tombstone is revived (importing is
# deliberate, as a copy is) and the fence only rises.
IMPORT_THREADS_SQL = f"""
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, retention, fence)
SELECT i, c, u, o, r::jsonb, f
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[])
     AS x(i, c, u, o, r, f)
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at,
    touched_at = EXCLUDED.touched_at, retention = coalesce(EXCLUDED.retention, t.retention),
    fence = greatest(t.fence, EXCLUDED.fence), deleted_at = NULL
"""


def _canonical(text: str | None) -> str | None:
    return None if text is None else codec.dump_json(orjson.loads(text))


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


class BulkRows:
    """`runstore.checkpoint.bulk.BulkSaver` on `PostgresSaver` (its leased connections)."""

    _leases: PostgresCalls
    _prefetch: PrefetchStore

    async def aexport_thread_rows(self, thread_ids: Sequence[str]) -> list[ThreadRows]:
        """The live threads among ``thread_ids`` as stored (one snapshot; absent ids left out)."""
        ids = checked_ids(thread_ids, "thread_ids")

        async def go(conn: Any) -> list[ThreadRows]:
            threads = {
                row[0]: ThreadRows(row[0], row[1], row[2], row[3], _canonical(row[4]), row[5])
                for row in await conn.fetch(EXPORT_THREADS_SQL, ids)
            }
            for row in await conn.fetch(EXPORT_CHECKPOINTS_SQL, ids):
                held = threads.get(row[0])
                if held is not None:
                    held.checkpoints.append((*row[:7], *map(_canonical, row[7:10]), row[10]))
            for statement, part in ((EXPORT_BLOBS_SQL, "blobs"), (EXPORT_WRITES_SQL, "writes")):
                for row in await conn.fetch(statement, ids):
                    held = threads.get(row[0])
                    if held is not None:
                        getattr(held, part).append(tuple(row))
            return [threads[t] for t in ids if t in threads]

        exported: list[ThreadRows] = await self._leases.run(
            go, operation="export_thread_rows", begin="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        )
        return exported

    async def aheld_thread_ids(self, thread_ids: Sequence[str]) -> set[str]:
        """Which of ``thread_ids`` hold a checkpoint here."""
        ids = checked_ids(thread_ids, "thread_ids")

        async def go(conn: Any) -> set[str]:
            return {row[0] for row in await conn.fetch(HELD_SQL, ids)}

        held: set[str] = await self._leases.run(go, operation="held_thread_ids")
        return held

    async def aimport_thread_rows(self, threads: Sequence[ThreadRows]) -> list[ImportedThread]:
        """Insert the rows this database lacks, in one transaction, and set each thread's record."""
        if not threads:
            return []
        ids = checked_ids([t.thread_id for t in threads], "thread_ids")
        checkpoints = [row for t in threads for row in t.checkpoints]
        blobs = [row for t in threads for row in t.blobs]
        writes = [row for t in threads for row in t.writes]
        stamps = [(t.thread_id, t.created_at, t.updated_at, t.touched_at, t.retention, t.fence) for t in threads]

        async def go(conn: Any) -> tuple[Counter[str], Counter[str]]:
            added = Counter(r[0] for r in await conn.fetch(IMPORT_CHECKPOINTS_SQL, *_columns(checkpoints, 11)))
            if blobs:
                await conn.execute(IMPORT_BLOBS_SQL, *_columns(blobs, 6))
            wrote = Counter(r[0] for r in await conn.fetch(IMPORT_WRITES_SQL, *_columns(writes, 9)))
            await conn.execute(IMPORT_THREADS_SQL, *_columns(stamps, 6))
            await conn.executemany(thread_sql.REFRESH_THREAD_SQL, [(i,) for i in ids])
            return added, wrote

        with self._prefetch.writing():
            added, wrote = await self._leases.run(
                go, operation="import_thread_rows", write=True, idempotent=True, begin="BEGIN"
            )
        return [ImportedThread(i, added[i], wrote[i]) for i in ids]
