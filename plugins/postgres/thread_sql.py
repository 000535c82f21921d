"""SQL text of the PostgreSQL saver's thread records: deletion (tombstones, fences),
copy, prune, ``delete_for_runs``, the thread index's listing and the retention sweep.

Every statement is a constant (asyncpg prepares each once per connection) except
`list_threads_sql`, whose shape depends on the query. The checkpoint statements and
the fragments these share with them (the parent-link walk, the "missing delta
channels" expression, the metadata filter) are in `runstore.plugins.postgres.sql`.
"""

from __future__ import annotations

from typing import Any

from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.rules import THREAD_ID_METADATA_KEY
from runstore.checkpoint.threads import (
    THREADS,
    ThreadQuery,
    footprint_sql,
    refresh_sql,
    status_case,
)

from .sql import MISSING_CHANNELS, WALK_CTE, filter_clauses

# Delete a thread's rows (after `LOCK_THREAD_SQL`); answers what they held, like
# `THREAD_FOOTPRINT_SQL` answers without deleting.
PURGE_THREAD_SQL = f"""
WITH c AS (DELETE FROM {CHECKPOINTS} WHERE thread_id = $1
           RETURNING length(checkpoint) + length(metadata::text) AS n),
     b AS (DELETE FROM {BLOBS} WHERE thread_id = $1 RETURNING length(blob) AS n),
     w AS (DELETE FROM {WRITES} WHERE thread_id = $1 RETURNING length(blob) AS n)
SELECT (SELECT count(*) FROM c), (SELECT coalesce(sum(n), 0) FROM c),
       (SELECT count(*) FROM w), (SELECT coalesce(sum(n), 0) FROM w),
       (SELECT count(*) FROM b), (SELECT coalesce(sum(n), 0) FROM b)
"""
THREAD_FOOTPRINT_SQL = footprint_sql(
    "$1", metadata_text="x.metadata::text", checkpoints=CHECKPOINTS, blobs=BLOBS, writes=WRITES
)
# A deletion first locks the thread's record: writes that locked it first have committed
# (and their rows are deleted next); later ones wait and then see the tombstone.
LOCK_THREAD_SQL = (
    f"SELECT deleted_at IS NULL AND checkpoints > 0 FROM {THREADS} WHERE thread_id = $1 FOR UPDATE"
)
# A fenced deletion's (or `afence_thread`'s) compare-and-set, first in its transaction:
# the fence rises to $3 unless it is higher (then no row is returned: refused). It locks
# the record like `LOCK_THREAD_SQL`; a thread without one gets it (not live).
FENCE_THREAD_SQL = f"""
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, fence)
VALUES ($1, $2, $2, $2, $3)
ON CONFLICT (thread_id) DO UPDATE SET fence = EXCLUDED.fence WHERE t.fence <= EXCLUDED.fence
RETURNING fence
"""
FENCE_OF_SQL = f"SELECT fence FROM {THREADS} WHERE thread_id = $1"
# `afence_thread` as one autocommit statement (it goes through the saver's group commit):
# the fence rises to $3; a higher fence fails the statement with `runstore_stale_fence`
# (SQLSTATE RS409, DETAIL the current fence), as a fenced put does. An equal fence
# writes nothing. The upsert locks the record, so it waits for writes that locked it
# first (a put locks it as its first step) and later ones see the new fence.
RAISE_FENCE_SQL = f"""
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, fence)
VALUES ($1, $2, $2, $2, $3)
ON CONFLICT (thread_id) DO UPDATE SET fence = CASE WHEN t.fence > EXCLUDED.fence
    THEN runstore_stale_fence($1, t.fence, EXCLUDED.fence) ELSE EXCLUDED.fence END
WHERE t.fence <> EXCLUDED.fence
"""
# The deletion tombstone: the record stays (keeping `fence`) so late writes are refused.
TOMBSTONE_THREAD_SQL = f"""
UPDATE {THREADS} SET deleted_at = $2, updated_at = $2, touched_at = $2,
    latest_checkpoint_id = NULL, metadata = '{{}}', status = 'idle', checkpoints = 0,
    writes = 0, bytes = 0, oldest_at = NULL, retention = NULL, swept_at = NULL,
    sweep_after = NULL, claimed_until = NULL
WHERE thread_id = $1
"""
# A copy target becomes a live thread (reviving a tombstone: copying is deliberate).
ENSURE_THREAD_SQL = f"""
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at) VALUES ($1, $2, $2, $2)
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = CASE WHEN t.deleted_at IS NULL THEN t.created_at ELSE EXCLUDED.created_at END,
    updated_at = greatest(t.updated_at, EXCLUDED.updated_at),
    touched_at = greatest(t.touched_at, EXCLUDED.touched_at), deleted_at = NULL
"""
THREAD_EXISTS_SQL = f"SELECT EXISTS (SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = $1)"
#: The record recomputed from the thread's rows (after a copy into it).
REFRESH_THREAD_SQL = refresh_sql(
    "$1", metadata_text="x.metadata::text", checkpoints=CHECKPOINTS, blobs=BLOBS, writes=WRITES
)
_HEAD_OF_1 = (
    f"(SELECT max(h.checkpoint_id) FROM {CHECKPOINTS} h WHERE h.thread_id = $1"
    " AND h.checkpoint_ns = '')"
)
# Rows deleted from a live thread (prune, delete_for_runs, retention): counts drop by
# what was deleted, relative to the record as locked, so concurrent writers' counts
# stay exact. When the latest root checkpoint itself went ($5 lists the deleted root
# ids), the record takes the new latest one's metadata and status.
SHRINK_THREAD_SQL = f"""
UPDATE {THREADS} SET
    checkpoints = greatest(checkpoints - $2, 0), writes = greatest(writes - $3, 0),
    bytes = greatest(bytes - $4, 0),
    oldest_at = (SELECT min(x.created_at) FROM {CHECKPOINTS} x WHERE x.thread_id = $1),
    latest_checkpoint_id = CASE WHEN latest_checkpoint_id = ANY($5::text[])
                                THEN {_HEAD_OF_1} ELSE latest_checkpoint_id END,
    metadata = CASE WHEN latest_checkpoint_id = ANY($5::text[])
                    THEN coalesce((SELECT x.metadata FROM {CHECKPOINTS} x WHERE x.thread_id = $1
                                   AND x.checkpoint_ns = '' AND x.checkpoint_id = {_HEAD_OF_1}),
                                  '{{}}'::jsonb)
                    ELSE metadata END,
    status = CASE WHEN latest_checkpoint_id = ANY($5::text[]) THEN {status_case(lambda ch: (
        f"EXISTS (SELECT 1 FROM {WRITES} w WHERE w.thread_id = $1 AND w.checkpoint_ns = ''"
        f" AND w.checkpoint_id = {_HEAD_OF_1} AND w.channel = '{ch}')"
    ))} ELSE status END
WHERE thread_id = $1 AND deleted_at IS NULL
"""

# The source wins on an id present in both threads (same rule as the sqlite saver); the
# copies' metadata thread id names the target (`rules.renamed_thread_metadata`).
COPY_THREAD_SQL = f"""
WITH c AS (
    INSERT INTO {CHECKPOINTS} AS t (thread_id, checkpoint_ns, checkpoint_id,
                                    parent_checkpoint_id, run_id, type, checkpoint, metadata,
                                    value_versions, channel_versions, created_at)
    SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint,
           CASE WHEN metadata ->> '{THREAD_ID_METADATA_KEY}' = $1
                THEN jsonb_set(metadata, '{{{THREAD_ID_METADATA_KEY}}}', to_jsonb($2::text))
                ELSE metadata END,
           value_versions, channel_versions, created_at
    FROM {CHECKPOINTS} WHERE thread_id = $1
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
        type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata,
        value_versions = EXCLUDED.value_versions, channel_versions = EXCLUDED.channel_versions
), b AS (
    INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $2, checkpoint_ns, channel, version, type, blob FROM {BLOBS} WHERE thread_id = $1
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = EXCLUDED.type, blob = EXCLUDED.blob
)
INSERT INTO {WRITES} (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, task_path,
                      channel, type, blob)
SELECT $2, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, blob
FROM {WRITES} WHERE thread_id = $1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type,
    blob = EXCLUDED.blob
"""

# keep_latest: per (thread, namespace) the head, plus every ancestor a delta
# reconstruction at the head reads (walk for the channels the head holds no value of).
PRUNE_KEEP_SQL = (
    "WITH RECURSIVE heads AS ("
    " SELECT DISTINCT ON (thread_id, checkpoint_ns) thread_id, checkpoint_ns, checkpoint_id,"
    " parent_checkpoint_id, " + MISSING_CHANNELS.format(alias=CHECKPOINTS) + " AS need"
    f" FROM {CHECKPOINTS} WHERE thread_id = ANY($1::text[])"
    " ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC),"
    + WALK_CTE.format(
        start=(
            "SELECT thread_id, checkpoint_ns, parent_checkpoint_id, need, 1 FROM heads"
            " WHERE parent_checkpoint_id IS NOT NULL"
        )
    )
    + """
SELECT thread_id, checkpoint_ns, checkpoint_id FROM heads
UNION
SELECT thread_id, checkpoint_ns, checkpoint_id FROM walk
"""
)

# delete_for_runs keeps a doomed checkpoint when a surviving one still rebuilds delta
# state through it. A walk starts at every survivor whose parent is doomed, and at
# every survivor that needs, beyond its surviving parent, a channel the parent's own
# walk does not look for (a channel that is a delta channel in the child but not in
# the parent, say). Any other survivor reads nothing its parent's walk does not.
RUNS_KEEP_SQL = (
    "WITH RECURSIVE doomed AS ("
    f" SELECT thread_id, checkpoint_ns, checkpoint_id FROM {CHECKPOINTS}"
    " WHERE run_id = ANY($1::text[])),"
    " frontier AS ("
    " SELECT s.thread_id, s.checkpoint_ns, s.parent_checkpoint_id, s.need"
    " FROM (SELECT DISTINCT thread_id, checkpoint_ns FROM doomed) AS t"
    # Per affected (thread, namespace): a primary-key prefix scan, never the whole table.
    " CROSS JOIN LATERAL ("
    " SELECT s.thread_id, s.checkpoint_ns, s.parent_checkpoint_id,"
    " " + MISSING_CHANNELS.format(alias="s") + " AS need"
    f" FROM {CHECKPOINTS} s WHERE s.thread_id = t.thread_id"
    " AND s.checkpoint_ns = t.checkpoint_ns"
    " AND (s.run_id IS NULL OR NOT (s.run_id = ANY($1::text[])))"
    " AND s.parent_checkpoint_id IS NOT NULL"
    " OFFSET 0) AS s"
    f" LEFT JOIN {CHECKPOINTS} p ON p.thread_id = s.thread_id"
    " AND p.checkpoint_ns = s.checkpoint_ns AND p.checkpoint_id = s.parent_checkpoint_id"
    " WHERE p.checkpoint_id IS NOT NULL AND cardinality(s.need) > 0 AND ("
    " p.run_id = ANY($1::text[])"
    " OR EXISTS (SELECT 1 FROM unnest(s.need) AS ch WHERE NOT (p.value_versions ? ch)"
    " AND NOT (ch = ANY(" + MISSING_CHANNELS.format(alias="p") + "))))),"
    + WALK_CTE.format(
        start="SELECT thread_id, checkpoint_ns, parent_checkpoint_id, need, 1 FROM frontier"
    )
    + """
SELECT d.thread_id, d.checkpoint_ns, d.checkpoint_id,
       EXISTS (SELECT 1 FROM walk w WHERE w.thread_id = d.thread_id
               AND w.checkpoint_ns = d.checkpoint_ns AND w.checkpoint_id = d.checkpoint_id)
       AS needed
FROM doomed d
"""
)

# Delete the given checkpoints of one (thread, ns) with their writes, cut the parent
# links that pointed at them, then drop blobs no remaining checkpoint holds.
# Answers the checkpoint rows and write rows deleted, with their bytes.
DELETE_CHECKPOINTS_SQL = f"""
WITH gone AS (
    DELETE FROM {CHECKPOINTS}
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3::text[])
    RETURNING length(checkpoint) + length(metadata::text) AS n
), w AS (
    DELETE FROM {WRITES}
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3::text[])
    RETURNING length(blob) AS n
), cut AS (
    UPDATE {CHECKPOINTS} SET parent_checkpoint_id = NULL
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND parent_checkpoint_id = ANY($3::text[])
      AND checkpoint_id <> ALL($3::text[])
)
SELECT (SELECT count(*) FROM gone), (SELECT coalesce(sum(n), 0) FROM gone),
       (SELECT count(*) FROM w), (SELECT coalesce(sum(n), 0) FROM w)
"""

# Answers the blob rows deleted and their bytes.
DELETE_GARBAGE_BLOBS_SQL = f"""
WITH held AS (
    SELECT DISTINCT v.key AS channel, v.value AS version
    FROM {CHECKPOINTS} c CROSS JOIN LATERAL jsonb_each_text(c.value_versions) AS v
    WHERE c.thread_id = $1 AND c.checkpoint_ns = $2
), gone AS (
    DELETE FROM {BLOBS} b
    WHERE b.thread_id = $1 AND b.checkpoint_ns = $2
      AND NOT EXISTS (SELECT 1 FROM held h WHERE h.channel = b.channel AND h.version = b.version)
    RETURNING length(b.blob) AS n
)
SELECT count(*), coalesce(sum(n), 0) FROM gone
"""


#: The columns of a `ThreadInfo`, in `runstore.checkpoint.threads.thread_info` order.
THREAD_INFO_COLUMNS = (
    "thread_id, created_at, updated_at, touched_at, latest_checkpoint_id, checkpoints, "
    "writes, bytes, status, metadata::text AS metadata, retention::text AS retention"
)
#: A thread as the index shows it: live (no tombstone) and holding a checkpoint.
LIVE_THREAD = "deleted_at IS NULL AND checkpoints > 0"
GET_THREAD_SQL = (
    f"SELECT {THREAD_INFO_COLUMNS} FROM {THREADS} WHERE thread_id = $1 AND {LIVE_THREAD}"
)


#: A filtered page first reads this many times its size of the newest records in order.
PROBE_FACTOR = 20


def list_threads_sql(query: ThreadQuery, *, probe: bool = False) -> tuple[str, list[Any]]:
    """The `list_threads` statement (one page, newest first) and its arguments; every
    condition is one an index on the record table answers.

    PostgreSQL keeps no statistics for JSONB containment, so a metadata filter is
    planned as rare and answered from the GIN index: every matching record is read and
    sorted, which is slow when many match. With ``probe``, the statement instead reads
    the newest ``PROBE_FACTOR * limit`` records in index order and filters those: when
    that fills the page, the page is exact (the first matches in order are among them);
    when not, the caller runs the plain statement.
    """
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    wheres = [LIVE_THREAD]
    if query.status is not None:
        wheres.append(f"status = {arg(query.status)}")
    if query.updated_after is not None:
        wheres.append(f"updated_at > {arg(query.updated_after)}")
    if query.updated_before is not None:
        wheres.append(f"updated_at < {arg(query.updated_before)}")
    order = query.order_by
    if query.after is not None:
        wheres.append(f"({order}, thread_id) < ({arg(query.after[0])}, {arg(query.after[1])})")
    ordering = f" ORDER BY {order} DESC, thread_id DESC LIMIT "
    if probe:
        inner = f"SELECT * FROM {THREADS} WHERE {' AND '.join(wheres)}{ordering}"
        inner += arg(query.limit * PROBE_FACTOR)
        matches = filter_clauses(query.terms, "metadata", arg) or ["true"]
        statement = (
            f"SELECT {THREAD_INFO_COLUMNS} FROM ({inner}) AS t WHERE {' AND '.join(matches)}"
            f"{ordering}{arg(query.limit)}"
        )
        return statement, args
    wheres.extend(filter_clauses(query.terms, "metadata", arg, indexed=True))
    statement = f"SELECT {THREAD_INFO_COLUMNS} FROM {THREADS} WHERE {' AND '.join(wheres)}"
    return statement + ordering + arg(query.limit), args


# --------------------------------------------------------------------------- retention

# The threads a sweep looks at next, by thread id after the cursor ($1): live threads
# some limit may touch that were not swept since their last write (or are due again),
# and tombstones whose events and stream keys are not deleted yet (`swept_at` unset).
# Unset limits are NULL (never true). `SKIP LOCKED` passes over threads another sweeper
# is claiming and threads a writer holds right now, so sweepers split the work and never
# wait for a writer; the claim ($7) keeps other sweepers off until it lapses. A thread
# idle past the TTL is always due; otherwise one swept since its last write is looked at
# again when its `sweep_after` comes, or on a rescan ($8: the policy changed).
_SWEEP_CANDIDATES = f"""
SELECT thread_id, deleted_at IS NOT NULL AS deleted FROM {THREADS}
WHERE thread_id > $1::text AND (claimed_until IS NULL OR claimed_until <= $2::bigint)
  AND ($9::text[] IS NULL OR thread_id = ANY($9::text[])) AND (
    (deleted_at IS NULL AND checkpoints > 0
     AND (touched_at <= $4::bigint
          OR ((retention IS NOT NULL OR checkpoints > $5::bigint OR oldest_at <= $6::bigint)
              AND ($8::boolean OR swept_at IS NULL OR touched_at > swept_at
                   OR sweep_after <= $2::bigint))))
    OR (deleted_at IS NOT NULL AND swept_at IS NULL))
ORDER BY thread_id LIMIT $3
"""
CLAIM_SWEEP_SQL = f"""
WITH c AS ({_SWEEP_CANDIDATES} FOR UPDATE SKIP LOCKED)
UPDATE {THREADS} t SET claimed_until = $7::bigint FROM c WHERE t.thread_id = c.thread_id
RETURNING t.thread_id, c.deleted
"""
#: A dry run's candidates: the same threads, nothing claimed ($7 unused but typed).
PEEK_SWEEP_SQL = f"SELECT thread_id, deleted FROM ({_SWEEP_CANDIDATES}) c WHERE $7::bigint IS NULL"
#: What a sweep of one thread reads first; locks the record as a deletion does.
SWEEP_STATE_SQL = (
    f"SELECT deleted_at, checkpoints, touched_at, retention::text FROM {THREADS}"
    " WHERE thread_id = $1 FOR UPDATE"
)
#: Every checkpoint of a thread as `runstore.checkpoint.retention.CheckpointGraph` reads it.
THREAD_GRAPH_SQL = f"""
SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, metadata::text,
       value_versions::text, channel_versions::text, created_at
FROM {CHECKPOINTS} WHERE thread_id = $1
"""
SWEPT_THREAD_SQL = f"""
UPDATE {THREADS} SET swept_at = $2, sweep_after = $3, claimed_until = NULL WHERE thread_id = $1
"""
#: Tombstones whose other stores were cleaned: the sweeper is done with them.
CLEANED_THREADS_SQL = f"""
UPDATE {THREADS} SET swept_at = $2, claimed_until = NULL
WHERE thread_id = ANY($1::text[]) AND deleted_at IS NOT NULL
"""
# Overrides on a live thread (a record without checkpoints yet is created to hold them);
# answers whether the thread is deleted (then nothing changed).
SET_RETENTION_SQL = f"""
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, retention)
VALUES ($1, $2, $2, $2, $3::jsonb)
ON CONFLICT (thread_id) DO UPDATE SET retention = EXCLUDED.retention, swept_at = NULL
WHERE t.deleted_at IS NULL
RETURNING 1
"""
#: The saver's tables, and their total size (heap, TOAST, indexes) in bytes. A table a DBA
#: partitioned (docs/scaling.md) has no storage of its own: its partitions are summed.
SAVER_TABLES = (CHECKPOINTS, BLOBS, WRITES, THREADS)
SAVER_TABLES_SIZE_SQL = "SELECT " + " + ".join(
    f"pg_total_relation_size('{t}'::regclass) + coalesce((SELECT sum(pg_total_relation_size(p.relid))"
    f" FROM pg_partition_tree('{t}'::regclass) p), 0)"
    for t in SAVER_TABLES
)
#: A read that counts as activity (`PostgresSaver.atouch_thread`): idle_ttl restarts.
TOUCH_THREAD_SQL = (
    f"UPDATE {THREADS} SET touched_at = greatest(touched_at, $2)"
    " WHERE thread_id = $1 AND deleted_at IS NULL RETURNING 1"
)
