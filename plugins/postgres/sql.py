"""Schema, migrations and SQL text of the PostgreSQL checkpoint saver.

Tables and columns are the ones every runstore SQL saver stores
(`runstore.checkpoint.codec`), in PostgreSQL's types: metadata, ``value_versions``
and ``channel_versions`` are JSONB so filters and walks run in SQL. Every statement
is a constant (asyncpg prepares each once per connection) except `list_sql`, whose
shape depends on the filter.

The checkpoint statements stay together because they are built from shared
fragments (the parent-link walk, the id-range walk, the "missing delta channels"
expression), each defined once here; the thread records' statements (deletion, copy,
prune, the thread index, retention) are in `runstore.plugins.postgres.thread_sql`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import get_checkpoint_id

from runstore.checkpoint import codec
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES, dump_json
from runstore.checkpoint.filters import FilterTerm, filter_terms
from runstore.checkpoint.rules import DELTA_COUNTERS_KEY, PREFETCH_MAX_SUPERSTEPS, checked_text
from runstore.checkpoint.threads import (
    THREADS,
    backfill_sql,
    status_case,
    stronger_status_sql,
)
from runstore.clock import system_clock, to_micros
from runstore.sql.migrations import Migration

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: `runstore.sql.migrations` component name of this saver's tables.
COMPONENT = "postgres-saver"
#: Requested channels a range walk answers (bits of a 64-bit mask); more use the recursion.
MAX_MASK_CHANNELS = 62


async def _use_lz4(conn: AsyncConnection) -> None:
    """Compress large values with lz4 instead of pglz when the server has it (PG 14+ built
    with lz4): several times cheaper in server CPU, which shares the host with the app."""
    supported = (
        await conn.exec_driver_sql(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_catalog.pg_settings"
            " WHERE name = 'default_toast_compression'"
        )
    ).scalar()
    if not supported:
        return
    for table, column in ((BLOBS, "blob"), (WRITES, "blob"), (CHECKPOINTS, "checkpoint")):
        await conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


#: SQLSTATE of the error `runstore_thread_deleted` raises (a write refused by a tombstone).
THREAD_DELETED_SQLSTATE = "RS410"
#: SQLSTATE of the error `runstore_stale_fence` raises (a write carrying a stale token);
#: its DETAIL is the thread's current fence.
STALE_FENCE_SQLSTATE = "RS409"

#: One row per thread (`runstore.checkpoint.threads`); times in microseconds since the
#: epoch. ``fence`` and ``deleted_at`` serve fenced writes and the deletion tombstone.
#: Thread ids sort bytewise (``C``), as in sqlite and Python, so pages agree everywhere.
_THREADS_DDL = [
    f"""CREATE TABLE IF NOT EXISTS {THREADS} (
        thread_id TEXT COLLATE "C" PRIMARY KEY,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        touched_at BIGINT NOT NULL,
        latest_checkpoint_id TEXT,
        metadata JSONB NOT NULL DEFAULT '{{}}',
        status TEXT NOT NULL DEFAULT 'idle',
        checkpoints BIGINT NOT NULL DEFAULT 0,
        writes BIGINT NOT NULL DEFAULT 0,
        bytes BIGINT NOT NULL DEFAULT 0,
        oldest_at BIGINT,
        retention JSONB,
        swept_at BIGINT,
        sweep_after BIGINT,
        claimed_until BIGINT,
        fence BIGINT NOT NULL DEFAULT 0,
        deleted_at BIGINT
    )""",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_updated_idx ON {THREADS} (updated_at, thread_id)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_created_idx ON {THREADS} (created_at, thread_id)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_status_idx ON {THREADS}"
    " (status, updated_at, thread_id) WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_touched_idx ON {THREADS} (touched_at)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_deleted_idx ON {THREADS} (deleted_at)"
    " WHERE deleted_at IS NOT NULL",
    # Metadata filters add a containment test (`metadata @> doc`) this index answers.
    f"CREATE INDEX IF NOT EXISTS {THREADS}_metadata_idx ON {THREADS}"
    " USING gin (metadata jsonb_path_ops) WHERE deleted_at IS NULL",
    # A write that continues a deleted thread calls this to fail the whole statement.
    f"""CREATE OR REPLACE FUNCTION runstore_thread_deleted(thread text) RETURNS boolean
    LANGUAGE plpgsql AS $fn$
    BEGIN
        RAISE EXCEPTION USING ERRCODE = '{THREAD_DELETED_SQLSTATE}',
            MESSAGE = 'thread ' || thread || ' was deleted';
    END
    $fn$""",
]


async def _thread_index(conn: AsyncConnection) -> None:
    """Version 3: the thread index, back-filled; ``created_at`` on checkpoints (rows stored
    before get the migration's time, so their age counts from the upgrade)."""
    now = to_micros(system_clock())
    # A constant default: PostgreSQL adds the column without rewriting the table.
    await conn.exec_driver_sql(
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN created_at BIGINT NOT NULL DEFAULT {now}"
    )
    await conn.exec_driver_sql(f"ALTER TABLE {CHECKPOINTS} ALTER COLUMN created_at DROP DEFAULT")
    for statement in _THREADS_DDL:
        await conn.exec_driver_sql(statement)
    await conn.exec_driver_sql(
        backfill_sql(
            now,
            metadata_text="x.metadata::text",
            checkpoints=CHECKPOINTS,
            blobs=BLOBS,
            writes=WRITES,
        )
    )


#: Schema versions; append, never edit a released one. (Version 1's tables are the
#: sqlite saver's tables in PostgreSQL's types; each dialect keeps its released DDL
#: as it shipped, which is why the two texts stay side by side.)
SCHEMA_MIGRATIONS: list[Migration] = [
    Migration(
        1,
        [
            f"""CREATE TABLE IF NOT EXISTS {CHECKPOINTS} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                parent_checkpoint_id TEXT,
                run_id TEXT,
                type TEXT NOT NULL,
                checkpoint BYTEA NOT NULL,
                metadata JSONB NOT NULL DEFAULT '{{}}',
                value_versions JSONB NOT NULL DEFAULT '{{}}',
                channel_versions JSONB NOT NULL DEFAULT '{{}}',
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
            )""",
            f"""CREATE INDEX IF NOT EXISTS {CHECKPOINTS}_run_id_idx
                ON {CHECKPOINTS} (run_id) WHERE run_id IS NOT NULL""",
            f"""CREATE TABLE IF NOT EXISTS {BLOBS} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                channel TEXT NOT NULL,
                version TEXT NOT NULL,
                type TEXT NOT NULL,
                blob BYTEA NOT NULL,
                PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {WRITES} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                task_id TEXT NOT NULL,
                idx INTEGER NOT NULL,
                task_path TEXT NOT NULL DEFAULT '',
                channel TEXT NOT NULL,
                type TEXT NOT NULL,
                blob BYTEA NOT NULL,
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            )""",
        ],
        "checkpoints, channel blobs, pending writes, run_id index",
    ),
    Migration(2, [_use_lz4], "lz4 compression of the value columns when available"),
    Migration(3, [_thread_index], "the thread index, checkpoints.created_at"),
    Migration(
        4,
        [
            # A fenced write whose token is older than the thread's fence calls this
            # from its compare-and-set, failing the whole statement.
            f"""CREATE OR REPLACE FUNCTION runstore_stale_fence(thread text, current bigint,
                                                          given bigint) RETURNS bigint
            LANGUAGE plpgsql AS $fn$
            BEGIN
                RAISE EXCEPTION USING ERRCODE = '{STALE_FENCE_SQLSTATE}',
                    MESSAGE = 'thread ' || thread || ' is fenced at ' || current
                              || '; a write carried ' || given,
                    DETAIL = current::text;
            END
            $fn$""",
        ],
        "fenced writes: runstore_stale_fence",
    ),
    Migration(
        5,
        [
            # Every write updates its thread's record. An update that changes no indexed
            # column can be a HOT update (no new index entries, the old version pruned in
            # place) when the record's page has room: pending writes move only counters
            # and `touched_at`, so keep `touched_at` out of the indexes (no statement
            # searches by it: the sweep walks thread ids in order) and leave room on
            # each page. The table holds one short row per thread, so the space is small.
            f"DROP INDEX IF EXISTS {THREADS}_touched_idx",
            f"ALTER TABLE {THREADS} SET (fillfactor = 70)",
        ],
        "thread records: HOT updates for pending writes (no touched_at index, fillfactor 70)",
    ),
]

# A write first locks its thread's record (`FOR NO KEY UPDATE`: a concurrent deletion
# commits before or after it, never in between) and fails if the thread was deleted;
# a put without a parent starts a deleted thread again.
_THREAD_GUARD = f"""
th AS (
    SELECT deleted_at FROM {THREADS} WHERE thread_id = $1 FOR NO KEY UPDATE
), ok AS (
    SELECT CASE WHEN {{continues}} AND EXISTS (SELECT 1 FROM th WHERE deleted_at IS NOT NULL)
                THEN runstore_thread_deleted($1) ELSE true END AS go
)"""

# The record takes the latest root checkpoint's metadata and status; `t` is the record
# as locked (the newest version), so concurrent puts never move it backwards.
_IS_HEAD = (
    "($2 = '' AND (t.deleted_at IS NOT NULL OR t.latest_checkpoint_id IS NULL"
    " OR $3 >= t.latest_checkpoint_id))"
)
_LIVE = "CASE WHEN t.deleted_at IS NULL THEN {0} ELSE {1} END"


def _fence_cas(token: str) -> str:
    """The record's new ``fence`` in a write's final upsert: the compare-and-set of a fenced
    write (``token`` is its parameter, NULL when unfenced). It runs on the record as
    locked (the newest version), so a stale token fails the statement and nothing of the
    write commits; a thread whose record this statement inserts had no fence yet."""
    return (
        f"CASE WHEN {token}::bigint IS NULL THEN t.fence"
        f" WHEN t.fence > {token}::bigint THEN runstore_stale_fence($1, t.fence, {token}::bigint)"
        f" ELSE {token}::bigint END"
    )


# One statement: both blob inserts, the checkpoint upsert and the thread record commit
# together (one WAL flush). New-version blobs replace (re-putting a checkpoint replaces
# its values, as InMemorySaver does); carried blobs only fill a gap. $19 is the
# saver's clock, $20 the bytes the put stores (counted only when the checkpoint is new:
# a replayed put replaces rows already counted), $21 the fencing token (NULL: unfenced).
PUT_SQL = f"""
WITH {_THREAD_GUARD.format(continues="$4::text IS NOT NULL")}, new_blobs AS (
    INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $1, $2, u.channel, u.version, u.type, u.blob
    FROM ok, unnest($10::text[], $11::text[], $12::text[], $13::bytea[]) AS u(channel, version, type, blob)
    WHERE ok.go
    ON CONFLICT (thread_id, checkpoint_ns, channel, version)
    DO UPDATE SET type = EXCLUDED.type, blob = EXCLUDED.blob
), carried_blobs AS (
    INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $1, $2, u.channel, u.version, u.type, u.blob
    FROM ok, unnest($14::text[], $15::text[], $16::text[], $17::bytea[]) AS u(channel, version, type, blob)
    WHERE ok.go
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
), ck AS (
    INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                               run_id, type, checkpoint, metadata, value_versions,
                               channel_versions, created_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9::text::jsonb, $18::text::jsonb, $19
    FROM ok WHERE ok.go
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id,
        run_id = EXCLUDED.run_id,
        type = EXCLUDED.type,
        checkpoint = EXCLUDED.checkpoint,
        metadata = EXCLUDED.metadata,
        value_versions = EXCLUDED.value_versions,
        channel_versions = EXCLUDED.channel_versions
    RETURNING (xmax = 0) AS added
)
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, latest_checkpoint_id,
                            metadata, status, checkpoints, writes, bytes, oldest_at, fence)
SELECT $1, $19, $19, $19, CASE WHEN $2 = '' THEN $3 END,
       CASE WHEN $2 = '' THEN $8::text::jsonb ELSE '{{}}'::jsonb END,
       {status_case(lambda ch: (
           f"EXISTS (SELECT 1 FROM {WRITES} x WHERE x.thread_id = $1 AND x.checkpoint_ns = $2"
           f" AND x.checkpoint_id = $3 AND x.idx < 0 AND x.channel = '{ch}')"
       ))},
       ck.added::int, 0, CASE WHEN ck.added THEN $20 ELSE 0 END, CASE WHEN ck.added THEN $19 END, coalesce($21::bigint, 0)
FROM ck
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = {_LIVE.format("t.created_at", "EXCLUDED.created_at")},
    updated_at = {_LIVE.format("greatest(t.updated_at, EXCLUDED.updated_at)", "EXCLUDED.updated_at")},
    touched_at = {_LIVE.format("greatest(t.touched_at, EXCLUDED.touched_at)", "EXCLUDED.touched_at")},
    checkpoints = {_LIVE.format("t.checkpoints", "0")} + EXCLUDED.checkpoints,
    writes = {_LIVE.format("t.writes", "0")},
    bytes = {_LIVE.format("t.bytes", "0")} + EXCLUDED.bytes,
    oldest_at = {_LIVE.format("least(t.oldest_at, EXCLUDED.oldest_at)", "EXCLUDED.oldest_at")},
    latest_checkpoint_id = CASE WHEN {_IS_HEAD} THEN $3 ELSE t.latest_checkpoint_id END,
    metadata = CASE WHEN {_IS_HEAD} THEN EXCLUDED.metadata ELSE t.metadata END,
    status = CASE WHEN {_IS_HEAD} THEN EXCLUDED.status ELSE t.status END,
    retention = {_LIVE.format("t.retention", "NULL")},
    swept_at = NULL,  -- written since its last sweep, whatever the clocks say
    sweep_after = {_LIVE.format("t.sweep_after", "NULL")},
    claimed_until = {_LIVE.format("t.claimed_until", "NULL")},
    deleted_at = NULL,
    fence = {_fence_cas("$21")}
"""

# Normal writes are first-write-wins per (task_id, idx); the special negative slots
# (errors, interrupts, resumes) are last-write-wins. The thread record counts the rows
# added; a special write on the latest root checkpoint can raise its status. $10 is
# the saver's clock, $11 the fencing token (NULL: unfenced).
PUT_WRITES_SQL = f"""
WITH {_THREAD_GUARD.format(continues="true")}, w AS (
    INSERT INTO {WRITES} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                          idx, channel, type, blob)
    SELECT $1, $2, $3, $4, $5, u.idx, u.channel, u.type, u.blob
    FROM ok, unnest($6::int[], $7::text[], $8::text[], $9::bytea[]) AS u(idx, channel, type, blob)
    WHERE ok.go
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = EXCLUDED.task_path,
        channel = EXCLUDED.channel,
        type = EXCLUDED.type,
        blob = EXCLUDED.blob
    WHERE {WRITES}.idx < 0
    RETURNING (xmax = 0) AS added, length(blob) AS size, channel
)
INSERT INTO {THREADS} AS t (thread_id, created_at, updated_at, touched_at, status, writes, bytes,
                            fence)
SELECT $1, $10, $10, $10,
       {status_case(lambda ch: f"bool_or(w.channel = '{ch}')")},
       count(*) FILTER (WHERE w.added), coalesce(sum(w.size) FILTER (WHERE w.added), 0),
       coalesce($11::bigint, 0)
FROM w
ON CONFLICT (thread_id) DO UPDATE SET
    fence = {_fence_cas("$11")},
    writes = t.writes + EXCLUDED.writes,
    bytes = t.bytes + EXCLUDED.bytes,
    touched_at = greatest(t.touched_at, EXCLUDED.touched_at),
    swept_at = NULL,  -- written since its last sweep, whatever the clocks say
    status = CASE WHEN $2 = '' AND t.latest_checkpoint_id = $3
                  THEN {stronger_status_sql("t.status", "EXCLUDED.status")} ELSE t.status END
"""

# Checkpoint row + its held values + its pending writes, as parallel arrays so
# asyncpg decodes them without composite-type lookups.
_TUPLE_COLUMNS = f"""
    c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
    c.checkpoint, c.metadata::text AS metadata,
    bl.channels AS b_channels, bl.types AS b_types, bl.blobs AS b_blobs,
    wr.task_ids AS w_task_ids, wr.channels AS w_channels, wr.types AS w_types,
    wr.blobs AS w_blobs, wr.paths AS w_paths, wr.idxs AS w_idxs
FROM {{source}}
LEFT JOIN LATERAL (
    SELECT array_agg(v.key) AS channels, array_agg(b.type) AS types,
           array_agg(b.blob) AS blobs
    FROM jsonb_each_text(c.value_versions) AS v
    CROSS JOIN LATERAL (
        -- LIMIT 1 keeps this a primary-key probe per held channel; as a plain join
        -- the planner may hash the thread's whole blob set instead.
        SELECT b.type, b.blob FROM {BLOBS} b
        WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
          AND b.channel = v.key AND b.version = v.value
        LIMIT 1
    ) b
) bl ON true
LEFT JOIN LATERAL (
    SELECT array_agg(w.task_id) AS task_ids, array_agg(w.channel) AS channels,
           array_agg(w.type) AS types, array_agg(w.blob) AS blobs,
           array_agg(w.task_path) AS paths, array_agg(w.idx) AS idxs
    FROM {WRITES} w
    WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
      AND w.checkpoint_id = c.checkpoint_id
) wr ON true
"""

# The delta walk. Each row is one ancestor with the channels still looking for a
# value when the walk reaches it (`need`); it contributes its writes for those
# channels and seeds the ones it holds. The walk follows parent links only, stops
# per channel at the first holder, and entirely once no channel is left.
# `{start}` yields (thread_id, checkpoint_ns, checkpoint_id, need, depth) rows: the
# first ancestor of each walk.
WALK_CTE = f"""
walk (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, value_versions, need, depth) AS (
    SELECT a.thread_id, a.checkpoint_ns, a.checkpoint_id, a.parent_checkpoint_id,
           a.value_versions, s.need, s.depth
    FROM ({{start}}) AS s(thread_id, checkpoint_ns, checkpoint_id, need, depth)
    JOIN {CHECKPOINTS} a ON a.thread_id = s.thread_id AND a.checkpoint_ns = s.checkpoint_ns
                        AND a.checkpoint_id = s.checkpoint_id
    WHERE cardinality(s.need) > 0
  UNION ALL
    SELECT a.thread_id, a.checkpoint_ns, a.checkpoint_id, a.parent_checkpoint_id,
           a.value_versions, r.rest, w.depth + 1
    FROM walk w
    CROSS JOIN LATERAL (
        -- Most ancestors hold none of the needed channels: keep `need` without
        -- unnesting it (`?|` is one jsonb probe).
        SELECT CASE WHEN w.value_versions ?| w.need
                    THEN ARRAY(SELECT ch FROM unnest(w.need) AS ch
                               WHERE NOT (w.value_versions ? ch))
                    ELSE w.need END AS rest
    ) r
    JOIN {CHECKPOINTS} a ON a.thread_id = w.thread_id AND a.checkpoint_ns = w.checkpoint_ns
                        AND a.checkpoint_id = w.parent_checkpoint_id
    WHERE cardinality(r.rest) > 0 AND w.depth < 1000000
)
"""

# History rows (`codec.HistoryRow` shape) of a walk: the writes each walk row
# contributes for the channels it is still needed for, and the seed blobs.
_HISTORY_SELECT = f"""
SELECT w.depth, x.channel, {codec.HISTORY_WRITE} AS kind, x.task_id, x.task_path, x.idx,
       x.type, x.blob
FROM walk w
CROSS JOIN LATERAL (
    -- OFFSET 0 / LIMIT 1 keep these index probes per walk row: flattened into joins,
    -- the planner may scan whole tables.
    SELECT x.channel, x.task_id, x.task_path, x.idx, x.type, x.blob FROM {WRITES} x
    WHERE x.thread_id = w.thread_id AND x.checkpoint_ns = w.checkpoint_ns
      AND x.checkpoint_id = w.checkpoint_id AND x.channel = ANY(w.need)
    OFFSET 0
) x
UNION ALL
SELECT w.depth, ch, {codec.HISTORY_SEED}, NULL, NULL, NULL, b.type, b.blob
FROM walk w
CROSS JOIN LATERAL unnest(w.need) AS ch
CROSS JOIN LATERAL (
    SELECT b.type, b.blob FROM {BLOBS} b
    WHERE b.thread_id = w.thread_id AND b.checkpoint_ns = w.checkpoint_ns
      AND b.channel = ch AND b.version = w.value_versions ->> ch
    LIMIT 1
) b
WHERE w.value_versions ? ch
"""

# $1 thread, $2 ns, $3 target id (NULL = latest), $4 channels.
DELTA_HISTORY_SQL = (
    "WITH RECURSIVE target AS ("
    f" SELECT t.thread_id, t.checkpoint_ns, t.parent_checkpoint_id FROM {CHECKPOINTS} t"
    " WHERE t.thread_id = $1 AND t.checkpoint_ns = $2"
    " AND ($3::text IS NULL OR t.checkpoint_id = $3)"
    " ORDER BY t.checkpoint_id DESC LIMIT 1),"
    + WALK_CTE.format(
        start=(
            "SELECT thread_id, checkpoint_ns, parent_checkpoint_id, $4::text[], 1 FROM target"
            " WHERE parent_checkpoint_id IS NOT NULL"
        )
    )
    + _HISTORY_SELECT
)

# The delta history by range instead of recursion: LangGraph's counters say how many
# supersteps the target is past its snapshot, and on a linear thread those ancestors
# are exactly the checkpoints just below it in id order. One statement returns that
# many candidates (ids, parents, which requested channels each holds), their writes
# for the requested channels, and per channel the blob of the newest candidate that
# holds it; `history.walk_range` then follows the real parent links through them and gives
# up (the recursive query answers instead) when the chain leaves the range or meets
# a holder other than the one whose blob came back, as on a fork.
def range_walk_sql(target: str, metadata: str, channels: str) -> str:
    """The range statement below checkpoint id ``target`` (SQL expressions for the id,
    its metadata and the requested channels, at most 62; none means no work)."""
    return f"""
WITH req AS (SELECT {channels} AS chs
), span AS (
    SELECT coalesce(max(CASE WHEN jsonb_typeof(e.value -> 1) = 'number'
                             THEN least((e.value ->> 1)::numeric, 1000000) END), 56)::bigint
           + 8 AS n
    FROM jsonb_each(CASE WHEN jsonb_typeof({metadata} -> '{DELTA_COUNTERS_KEY}') = 'object'
                         THEN {metadata} -> '{DELTA_COUNTERS_KEY}' ELSE '{{}}'::jsonb END) AS e
), cand AS (
    SELECT k.checkpoint_id, k.parent_checkpoint_id, k.value_versions
    FROM {CHECKPOINTS} k
    WHERE k.thread_id = $1 AND k.checkpoint_ns = $2 AND k.checkpoint_id <= {target}
      AND cardinality((SELECT chs FROM req)) BETWEEN 1 AND {MAX_MASK_CHANNELS}
    ORDER BY k.checkpoint_id DESC
    LIMIT (SELECT n + 1 FROM span)
)
SELECT (SELECT chs FROM req) AS need, ca.ids, ca.parents, ca.masks,
       wr.ids AS w_ids, wr.channels AS w_channels, wr.task_ids AS w_task_ids,
       wr.paths AS w_paths, wr.idxs AS w_idxs, wr.types AS w_types, wr.blobs AS w_blobs,
       sd.channels AS s_channels, sd.ids AS s_ids, sd.types AS s_types, sd.blobs AS s_blobs
FROM (
    -- One aggregate over one scan: the three arrays line up (their order is irrelevant).
    SELECT array_agg(k.checkpoint_id) AS ids, array_agg(k.parent_checkpoint_id) AS parents,
           array_agg((SELECT coalesce(bit_or(1::bigint << (u.i - 1)::int), 0)
                      FROM unnest((SELECT chs FROM req)) WITH ORDINALITY AS u(ch, i)
                      WHERE k.value_versions ? u.ch)) AS masks
    FROM cand k
) ca, (
    SELECT array_agg(x.checkpoint_id) AS ids, array_agg(x.channel) AS channels,
           array_agg(x.task_id) AS task_ids, array_agg(x.task_path) AS paths,
           array_agg(x.idx) AS idxs, array_agg(x.type) AS types, array_agg(x.blob) AS blobs
    FROM {WRITES} x
    WHERE x.thread_id = $1 AND x.checkpoint_ns = $2
      AND x.channel = ANY((SELECT chs FROM req)::text[])
      AND x.checkpoint_id < {target}
      AND x.checkpoint_id >= (SELECT min(checkpoint_id) FROM cand)
) wr, (
    SELECT array_agg(hd.ch) AS channels, array_agg(hd.checkpoint_id) AS ids,
           array_agg(bl.type) AS types, array_agg(bl.blob) AS blobs
    FROM (
        SELECT DISTINCT ON (u.ch) u.ch, k.checkpoint_id, k.value_versions ->> u.ch AS version
        FROM cand k CROSS JOIN unnest((SELECT chs FROM req)) AS u(ch)
        WHERE k.value_versions ? u.ch AND k.checkpoint_id < {target}
        ORDER BY u.ch, k.checkpoint_id DESC
    ) hd
    LEFT JOIN LATERAL (
        SELECT bb.type, bb.blob FROM {BLOBS} bb
        WHERE bb.thread_id = $1 AND bb.checkpoint_ns = $2 AND bb.channel = hd.ch
          AND bb.version = hd.version
        LIMIT 1
    ) bl ON true
) sd
"""


# $1 thread, $2 ns, $3 target id (NULL = latest), $4 channels (at most 62).
RANGE_HISTORY_SQL = (
    "WITH target AS ("
    f" SELECT t.checkpoint_id, t.metadata FROM {CHECKPOINTS} t"
    " WHERE t.thread_id = $1 AND t.checkpoint_ns = $2"
    " AND ($3::text IS NULL OR t.checkpoint_id = $3)"
    " ORDER BY t.checkpoint_id DESC LIMIT 1)"
    " SELECT (SELECT checkpoint_id FROM target) AS target_id, r.* FROM ("
    + range_walk_sql(
        "(SELECT checkpoint_id FROM target)", "(SELECT metadata FROM target)", "$4::text[]"
    )
    + ") r"
)



# The delta channels (named in LangGraph's `counters_since_delta_snapshot` metadata,
# see `saverbase.delta_channels`) a checkpoint has a version of but holds no value
# of: what a delta reconstruction at it rebuilds from ancestors. An ordinary channel
# with nothing stored (a consumed trigger) is just empty and needs no history.
MISSING_CHANNELS = (
    "ARRAY(SELECT k FROM jsonb_object_keys(CASE WHEN jsonb_typeof({alias}.metadata"
    f" -> '{DELTA_COUNTERS_KEY}') = 'object' THEN {{alias}}.metadata -> '{DELTA_COUNTERS_KEY}'"
    " ELSE '{{}}'::jsonb END) AS k"
    " WHERE {alias}.channel_versions ? k AND NOT ({alias}.value_versions ? k))"
)

# The channels whose history aget_tuple fetches along with the head: the missing delta
# channels, or none once a counter's supersteps since the snapshot pass the bound
# (`saverbase.worth_prefetching`; CASE because SQL does not promise evaluation order).
_PREFETCH_NEED = (
    "CASE WHEN EXISTS (SELECT 1 FROM jsonb_each(CASE WHEN jsonb_typeof(c.metadata"
    f" -> '{DELTA_COUNTERS_KEY}') = 'object' THEN c.metadata -> '{DELTA_COUNTERS_KEY}'"
    " ELSE '{}'::jsonb END) AS e WHERE CASE WHEN jsonb_typeof(e.value -> 1) = 'number'"
    f" THEN (e.value ->> 1)::numeric > {PREFETCH_MAX_SUPERSTEPS} ELSE false END)"
    " THEN ARRAY[]::text[] ELSE " + MISSING_CHANNELS.format(alias="c") + " END"
)

# aget_tuple also answers the delta history LangGraph asks for right after loading a
# delta checkpoint (its delta channels without a value), in the same round trip: the
# range walk's arrays below the head, plus the channels they answer (`h_need`).
_PREFETCH = (
    " LEFT JOIN LATERAL ("
    + range_walk_sql("c.checkpoint_id", "c.metadata", _PREFETCH_NEED)
    + ") hist ON true"
)
_RANGE_COLUMNS = (
    "need", "ids", "parents", "masks", "w_ids", "w_channels", "w_task_ids", "w_paths", "w_idxs",
    "w_types", "w_blobs", "s_channels", "s_ids", "s_types", "s_blobs",
)
_PREFETCH_COLUMNS = (
    ", "
    + ", ".join(f"hist.{name} AS h_{name}" for name in _RANGE_COLUMNS)
)


def _tuple_sql(source: str, where: str = "", *, prefetch: bool = False) -> str:
    columns = _TUPLE_COLUMNS.format(source=source)
    if prefetch:
        head, sep, tail = columns.partition("\nFROM ")
        columns = head + _PREFETCH_COLUMNS + sep + tail + _PREFETCH
    return "SELECT " + columns + where


_LATEST_SOURCE = (
    f"(SELECT * FROM {CHECKPOINTS} WHERE thread_id = $1 AND checkpoint_ns = $2"
    " ORDER BY checkpoint_id DESC LIMIT 1) c"
)
_BY_ID_WHERE = " WHERE c.thread_id = $1 AND c.checkpoint_ns = $2 AND c.checkpoint_id = $3"

# Only the thread's latest checkpoint (how a run starts) comes with its delta history:
# a walk that loads ancestors one by one would otherwise pay for a history each.
GET_BY_ID_SQL = _tuple_sql(f"{CHECKPOINTS} c", _BY_ID_WHERE)
GET_LATEST_SQL = _tuple_sql(_LATEST_SOURCE, prefetch=True)



def list_sql(
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """The `alist` query and its arguments.

    ``thread_id``, ``checkpoint_ns`` and ``checkpoint_id`` in ``config`` each narrow
    the result when present; metadata filters follow `runstore.checkpoint.filters`;
    rows come ordered by (checkpoint_id, thread_id, checkpoint_ns) descending.
    """
    wheres: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    configurable = (config or {}).get("configurable") or {}
    if configurable.get("thread_id") is not None:
        thread_id = checked_text(configurable["thread_id"], "config['configurable']['thread_id']")
        wheres.append(f"thread_id = {arg(thread_id)}")
    if configurable.get("checkpoint_ns") is not None:
        ns = checked_text(configurable["checkpoint_ns"], "checkpoint_ns", empty_ok=True)
        wheres.append(f"checkpoint_ns = {arg(ns)}")
    if checkpoint_id := configurable.get("checkpoint_id"):
        wheres.append(f"checkpoint_id = {arg(checked_text(checkpoint_id, 'checkpoint_id'))}")
    wheres.extend(filter_clauses(filter_terms(filter), "metadata", arg))
    if before is not None and (before_id := get_checkpoint_id(before)):
        wheres.append(f"checkpoint_id < {arg(checked_text(before_id, 'before checkpoint_id'))}")
    inner = f"SELECT * FROM {CHECKPOINTS}"
    if wheres:
        inner += " WHERE " + " AND ".join(wheres)
    inner += " ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC"
    if limit is not None:
        inner += f" LIMIT {arg(max(int(limit), 0))}"
    statement = (
        "SELECT "
        + _TUPLE_COLUMNS.format(source=f"({inner}) c")
        + " ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC"
    )
    return statement, args


def filter_clauses(
    terms: list[FilterTerm], column: str, arg: Callable[[Any], str], *, indexed: bool = False
) -> list[str]:
    """SQL conditions matching the JSONB ``column`` by the metadata filter rule
    (`runstore.checkpoint.filters`); ``arg(value)`` adds a parameter and renders it.

    With ``indexed``, each term that needs the key present also gets a containment test
    (``column @> {key: value}``), implied by it, that a GIN ``jsonb_path_ops`` index answers.
    """
    wheres: list[str] = []
    for term in terms:
        if term.kind == "never":
            wheres.append("false")
            continue
        if indexed and term.kind != "null":
            wheres.append(f"{column} @> {arg(dump_json({term.key: term.value}))}::text::jsonb")
        key = f"{arg(term.key)}::text"
        if term.kind == "null":
            wheres.append(f"({column} -> {key} IS NULL OR {column} -> {key} = 'null'::jsonb)")
        elif term.kind == "bool":
            wheres.append(f"{column} -> {key} = '{'true' if term.value else 'false'}'::jsonb")
        elif term.kind == "number":
            # CASE, not AND: SQL does not promise to test the type before the cast.
            wheres.append(
                f"(CASE WHEN jsonb_typeof({column} -> {key}) = 'number'"
                f" THEN ({column} ->> {key})::numeric = {arg(repr(term.value))}::numeric"
                " ELSE false END)"
            )
        elif term.kind == "text":
            wheres.append(
                f"(jsonb_typeof({column} -> {key}) = 'string'"
                f" AND {column} ->> {key} = {arg(term.value)})"
            )
        else:
            # jsonb equality is the shared document rule: numbers by value, keys unordered.
            wheres.append(f"{column} -> {key} = {arg(term.json_text)}::text::jsonb")
    return wheres
