"""PostgreSQL checkpoint saver on asyncpg: ``postgresql://user@host:5432/db?schema=app``.

Our own saver (not a wrapper of ``langgraph-checkpoint-postgres``). Rows are encoded
by the shared `runstore.checkpoint.codec`; this module owns the SQL, the connection
handling and the round-trip budget:

* ``aput`` is ONE statement (blobs CTEs + checkpoint upsert), so one round trip and
  one WAL flush per checkpoint; ``aput_writes`` is one ``INSERT ... SELECT unnest``.
  Writes that arrive while another commits are batched into the next commit.
* ``aget_tuple`` / ``alist`` read checkpoint, blobs and writes in one query.
* ``aget_delta_channel_history`` is one ``WITH RECURSIVE`` query over parent links.
* Connections come from the SQLAlchemy engine shared with the PostgreSQL event store
  (`runstore.plugins.postgres.engine.shared_engine`); the saver keeps a few of them leased between
  calls so a call does not pay a pool checkout (events, a ping after idling) each time.

Design notes and measurements: docs/savers.md, section "PostgreSQL".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from runstore.checkpoint import codec
from runstore.checkpoint.saverbase import (
    DELTA_COUNTERS_KEY,
    PREFETCH_MAX_SUPERSTEPS,
    ensure_off_loop,
    run_sync,
)
from runstore.errors import MissingDriverError
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from runstore.options import BackendOptions

R = TypeVar("R")

#: `runstore.sql.migrations` component name of this saver's tables.
COMPONENT = "postgres-saver"

CHECKPOINTS = "runstore_checkpoints"
BLOBS = "runstore_checkpoint_blobs"
WRITES = "runstore_checkpoint_writes"
#: Requested channels a range walk answers (bits of a 64-bit mask); more use the recursion.
_MAX_MASK_CHANNELS = 62


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


#: Schema versions; append, never edit a released one. A step is one SQL statement or
#: an async callable on the migration's SQLAlchemy connection.
SCHEMA_STEPS: list[list[Any]] = [
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
    [_use_lz4],
]

# One statement: both blob inserts and the checkpoint upsert commit together (one
# WAL flush). New-version blobs replace (re-putting a checkpoint replaces its values,
# as InMemorySaver does); carried blobs only fill a gap.
PUT_SQL = f"""
WITH new_blobs AS (
    INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $1, $2, u.channel, u.version, u.type, u.blob
    FROM unnest($10::text[], $11::text[], $12::text[], $13::bytea[]) AS u(channel, version, type, blob)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version)
    DO UPDATE SET type = EXCLUDED.type, blob = EXCLUDED.blob
), carried_blobs AS (
    INSERT INTO {BLOBS} (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT $1, $2, u.channel, u.version, u.type, u.blob
    FROM unnest($14::text[], $15::text[], $16::text[], $17::bytea[]) AS u(channel, version, type, blob)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
)
INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                           run_id, type, checkpoint, metadata, value_versions, channel_versions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9::text::jsonb, $18::text::jsonb)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = EXCLUDED.parent_checkpoint_id,
    run_id = EXCLUDED.run_id,
    type = EXCLUDED.type,
    checkpoint = EXCLUDED.checkpoint,
    metadata = EXCLUDED.metadata,
    value_versions = EXCLUDED.value_versions,
    channel_versions = EXCLUDED.channel_versions
"""

# Normal writes are first-write-wins per (task_id, idx); the special negative slots
# (errors, interrupts, resumes) are last-write-wins.
PUT_WRITES_SQL = f"""
INSERT INTO {WRITES} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                      idx, channel, type, blob)
SELECT $1, $2, $3, $4, $5, u.idx, u.channel, u.type, u.blob
FROM unnest($6::int[], $7::text[], $8::text[], $9::bytea[]) AS u(idx, channel, type, blob)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = EXCLUDED.task_path,
    channel = EXCLUDED.channel,
    type = EXCLUDED.type,
    blob = EXCLUDED.blob
WHERE {WRITES}.idx < 0
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
_WALK_CTE = f"""
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
    + _WALK_CTE.format(
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
# holds it; `_walk_range` then follows the real parent links through them and gives
# up (the recursive query answers instead) when the chain leaves the range or meets
# a holder other than the one whose blob came back, as on a fork.
def _range_walk_sql(target: str, metadata: str, channels: str) -> str:
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
      AND cardinality((SELECT chs FROM req)) BETWEEN 1 AND {_MAX_MASK_CHANNELS}
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
    + _range_walk_sql(
        "(SELECT checkpoint_id FROM target)", "(SELECT metadata FROM target)", "$4::text[]"
    )
    + ") r"
)


def _walk_range(
    get: Callable[[str], Any], target_id: str | None, wanted: Sequence[str]
) -> list[tuple[Any, ...]] | None:
    """`HistoryRow`s from a `_range_walk_sql` answer (``get`` reads its columns), or
    ``None`` if the range cannot answer: the chain leaves it, or reaches a holder whose
    blob was not fetched."""
    if target_id is None:
        return []  # no such checkpoint: every channel answers empty, as the walk would
    links = dict(
        zip(get("ids") or (), zip(get("parents") or (), get("masks") or (), strict=True), strict=True)
    )
    if target_id not in links:
        return None
    writes: dict[str, list[tuple[Any, ...]]] = {}
    for cid, *rest in zip(
        get("w_ids") or (),
        get("w_channels") or (),
        get("w_task_ids") or (),
        get("w_paths") or (),
        get("w_idxs") or (),
        get("w_types") or (),
        get("w_blobs") or (),
        strict=True,
    ):
        writes.setdefault(cid, []).append(tuple(rest))
    seeds = {
        ch: (cid, btype, blob)
        for ch, cid, btype, blob in zip(
            get("s_channels") or (),
            get("s_ids") or (),
            get("s_types") or (),
            get("s_blobs") or (),
            strict=True,
        )
    }
    bits = {ch: 1 << i for i, ch in enumerate(wanted)}
    need = set(wanted)
    out: list[tuple[Any, ...]] = []
    cursor = links[target_id][0]
    depth = 1
    while cursor is not None and need:
        if cursor not in links or depth > len(links):
            return None
        parent, mask = links[cursor]
        for channel, task_id, path, idx, btype, blob in writes.get(cursor, ()):
            if channel in need:
                out.append((depth, channel, codec.HISTORY_WRITE, task_id, path, idx, btype, blob))
        for channel in [ch for ch in need if mask & bits[ch]]:
            seed = seeds.get(channel)
            if seed is None or seed[0] != cursor:
                return None
            if seed[1] is not None:
                out.append((depth, channel, codec.HISTORY_SEED, None, None, None, *seed[1:]))
            need.discard(channel)
        cursor = parent
        depth += 1
    return out


# The delta channels (named in LangGraph's `counters_since_delta_snapshot` metadata,
# see `saverbase.delta_channels`) a checkpoint has a version of but holds no value
# of: what a delta reconstruction at it rebuilds from ancestors. An ordinary channel
# with nothing stored (a consumed trigger) is just empty and needs no history.
_MISSING_CHANNELS = (
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
    " THEN ARRAY[]::text[] ELSE " + _MISSING_CHANNELS.format(alias="c") + " END"
)

# aget_tuple also answers the delta history LangGraph asks for right after loading a
# delta checkpoint (its delta channels without a value), in the same round trip: the
# range walk's arrays below the head, plus the channels they answer (`h_need`).
_PREFETCH = (
    " LEFT JOIN LATERAL ("
    + _range_walk_sql("c.checkpoint_id", "c.metadata", _PREFETCH_NEED)
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

DELETE_THREAD_SQL = f"""
WITH c AS (DELETE FROM {CHECKPOINTS} WHERE thread_id = ANY($1::text[])),
     b AS (DELETE FROM {BLOBS} WHERE thread_id = ANY($1::text[]))
DELETE FROM {WRITES} WHERE thread_id = ANY($1::text[])
"""

# The source wins on an id present in both threads (same rule as the sqlite saver).
COPY_THREAD_SQL = f"""
WITH c AS (
    INSERT INTO {CHECKPOINTS} AS t (thread_id, checkpoint_ns, checkpoint_id,
                                    parent_checkpoint_id, run_id, type, checkpoint, metadata,
                                    value_versions, channel_versions)
    SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint,
           metadata, value_versions, channel_versions
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
    " parent_checkpoint_id, " + _MISSING_CHANNELS.format(alias=CHECKPOINTS) + " AS need"
    f" FROM {CHECKPOINTS} WHERE thread_id = ANY($1::text[])"
    " ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC),"
    + _WALK_CTE.format(
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
    " " + _MISSING_CHANNELS.format(alias="s") + " AS need"
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
    " AND NOT (ch = ANY(" + _MISSING_CHANNELS.format(alias="p") + "))))),"
    + _WALK_CTE.format(
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
DELETE_CHECKPOINTS_SQL = f"""
WITH gone AS (
    DELETE FROM {CHECKPOINTS}
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3::text[])
    RETURNING checkpoint_id
), w AS (
    DELETE FROM {WRITES}
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3::text[])
)
UPDATE {CHECKPOINTS} SET parent_checkpoint_id = NULL
WHERE thread_id = $1 AND checkpoint_ns = $2 AND parent_checkpoint_id = ANY($3::text[])
  AND checkpoint_id <> ALL($3::text[])
"""

DELETE_GARBAGE_BLOBS_SQL = f"""
WITH held AS (
    SELECT DISTINCT v.key AS channel, v.value AS version
    FROM {CHECKPOINTS} c CROSS JOIN LATERAL jsonb_each_text(c.value_versions) AS v
    WHERE c.thread_id = $1 AND c.checkpoint_ns = $2
)
DELETE FROM {BLOBS} b
WHERE b.thread_id = $1 AND b.checkpoint_ns = $2
  AND NOT EXISTS (SELECT 1 FROM held h WHERE h.channel = b.channel AND h.version = b.version)
"""


def _import_asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise MissingDriverError("postgres", "asyncpg", "postgres") from None
    return asyncpg


class _Leases:
    """Raw asyncpg connections borrowed from the shared SQLAlchemy engine.

    Up to ``max_idle`` stay checked out between calls: a checkout from the engine's
    pool runs its event hooks (and a ping after a second idle), which costs more
    than a small statement. A leased connection that turns out dead is discarded
    (invalidated in the engine's pool) and the call retried once on a fresh one.
    """

    def __init__(
        self, engine: AsyncEngine, max_idle: int, *, synchronous_commit: bool = True
    ) -> None:
        self._engine = engine
        self._max_idle = max_idle
        # Session settings live only while the connection is leased: the pool is shared
        # with the event store, so they are reset before a connection goes back.
        self._setup = None if synchronous_commit else "SET synchronous_commit = off"
        self._reset = None if synchronous_commit else "RESET synchronous_commit"
        self._server_error: type[BaseException] = _import_asyncpg().PostgresError
        self._idle: list[tuple[AsyncConnection, Any]] = []
        self._closed = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def _fresh(self) -> tuple[AsyncConnection, Any]:
        sa_conn = await self._engine.connect()
        try:
            raw = await sa_conn.get_raw_connection()
            driver = raw.driver_connection
            if self._setup is not None:
                await driver.execute(self._setup)
        except BaseException:
            await sa_conn.close()
            raise
        return sa_conn, driver

    async def run(self, fn: Callable[[Any], Awaitable[R]]) -> R:
        """Run ``fn(connection)`` on a leased connection (retried once if the lease was dead)."""
        reused = bool(self._idle)
        lease = self._idle.pop() if reused else await self._fresh()
        try:
            result = await fn(lease[1])
        except BaseException as exc:
            broken = lease[1].is_closed()
            await self._after_error(lease, exc)
            if not (reused and broken):
                raise
            lease = await self._fresh()
            try:
                result = await fn(lease[1])
            except BaseException as exc2:
                await self._after_error(lease, exc2)
                raise
        self._give_back(lease)
        return result

    async def _after_error(self, lease: tuple[AsyncConnection, Any], exc: BaseException) -> None:
        raw = lease[1]
        # A statement the server rejected leaves the connection usable; anything else
        # (cancellation mid-query, a network error) may leave it mid-protocol, so it is
        # invalidated rather than handed to the next user of the pool.
        if (
            isinstance(exc, self._server_error)
            and not raw.is_closed()
            and not raw.is_in_transaction()
        ):
            self._give_back(lease)
        else:
            await self._discard(lease, invalidate=True)

    def _give_back(self, lease: tuple[AsyncConnection, Any]) -> None:
        if self._closed or len(self._idle) >= self._max_idle or lease[1].is_closed():
            task = asyncio.ensure_future(self._discard(lease, invalidate=lease[1].is_closed()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._idle.append(lease)

    async def _discard(self, lease: tuple[AsyncConnection, Any], *, invalidate: bool) -> None:
        sa_conn, raw = lease
        if not invalidate and self._reset is not None:
            try:
                await raw.execute(self._reset)
            except Exception:  # cannot restore the session: never pool it
                invalidate = True
        try:
            if invalidate:
                await sa_conn.invalidate()
            await sa_conn.close()
        except Exception:  # a dead connection may fail to close; drop it
            pass

    async def aclose(self) -> None:
        """Return every idle connection to the engine's pool."""
        self._closed = True
        idle, self._idle = self._idle, []
        for lease in idle:
            await self._discard(lease, invalidate=False)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


_Op = tuple[str, Sequence[Any]]


class _WriteBatcher:
    """Coalesces concurrent checkpoint writes into one transaction (one WAL flush).

    LangGraph issues a step's ``aput_writes`` and the chained ``aput`` calls in the
    background, so several are usually in flight at once. A commit waits for a WAL
    flush (an fdatasync, milliseconds on a busy disk), so the writes that queue up
    while one batch commits go out together in the next: one ``executemany`` per
    statement (asyncpg pipelines its argument sets in one round trip), inside one
    transaction. Every caller still returns only after its own rows are committed:
    durability is unchanged. A batch that fails is re-run one operation at a time,
    so each caller gets its own error.
    """

    def __init__(self, leases: _Leases) -> None:
        self._leases = leases
        self._queue: list[tuple[_Op, asyncio.Future[None]]] = []
        self._busy = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def run(self, sql: str, args: Sequence[Any]) -> None:
        """Execute ``sql`` with ``args`` in the next batch; return once it is committed."""
        if self._busy:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append(((sql, args), fut))
            await fut
            return
        self._busy = True
        try:
            await self._leases.run(lambda conn: conn.execute(sql, *args))
        finally:
            if self._queue:
                task = asyncio.ensure_future(self._drain())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                self._busy = False

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._run_batch(batch)
        finally:
            self._busy = False

    async def _run_batch(self, batch: list[tuple[_Op, asyncio.Future[None]]]) -> None:
        if len(batch) > 1:
            # Per statement, in arrival order: rows one caller touches twice keep
            # their order, and rows of different statements never overlap.
            groups: dict[str, list[Sequence[Any]]] = {}
            for (sql, args), _ in batch:
                groups.setdefault(sql, []).append(args)

            async def together(conn: Any) -> None:
                if len(groups) == 1:
                    # executemany is atomic on its own: no BEGIN/COMMIT round trips.
                    [(sql, many)] = groups.items()
                    await conn.executemany(sql, many)
                    return
                async with conn.transaction():
                    for sql, many in groups.items():
                        await conn.executemany(sql, many)

            try:
                await self._leases.run(together)
            except Exception:  # retried one by one below
                pass
            else:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
                return
        for (sql, args), fut in batch:
            try:
                await self._leases.run(lambda conn, sql=sql, args=args: conn.execute(sql, *args))
            except BaseException as exc:  # handed to the waiting caller
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(None)


class _Prefetched:
    """Delta histories read along with a checkpoint, waiting for LangGraph's next call.

    Shared by a saver and its `with_allowlist` copies. ``generation`` moves at the
    start and end of every write of this saver, so an answer read while anything was
    written is never used; each answer is used once.
    """

    MAX_ENTRIES = 64

    def __init__(self) -> None:
        self.generation = 0
        self.entries: OrderedDict[tuple[str, str, str], tuple[int, frozenset[str], list[Any]]]
        self.entries = OrderedDict()

    def store(
        self, key: tuple[str, str, str], generation: int, need: Sequence[str], rows: list[Any]
    ) -> None:
        self.entries[key] = (generation, frozenset(need), rows)
        self.entries.move_to_end(key)
        while len(self.entries) > self.MAX_ENTRIES:
            self.entries.popitem(last=False)

    def take(self, key: tuple[str, str, str], channels: Sequence[str]) -> list[Any] | None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        generation, need, rows = entry
        if generation != self.generation or not set(channels) <= need:
            return None
        return rows


class PostgresSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoint saver on PostgreSQL (asyncpg), delta-safe, with sync twins.

    Open it with `PostgresSaver.open` (or ``runstore.open``); sync methods must be
    called from a thread other than the one running the saver's event loop.
    """

    #: Leased connections kept between calls (each counts against the shared pool).
    MAX_IDLE_CONNECTIONS = 3
    #: Blob keys (thread, ns, channel, version) known to be stored, for carried values.
    KNOWN_BLOBS_MAX = 8192

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: BackendURL,
        serde: SerializerProtocol | None = None,
        max_idle: int | None = None,
        synchronous_commit: bool = True,
    ) -> None:
        super().__init__(serde=serde)
        self.url = url
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        size = engine.sync_engine.pool.size() if hasattr(engine.sync_engine.pool, "size") else 2
        idle = self.MAX_IDLE_CONNECTIONS if max_idle is None else max_idle
        self._leases = _Leases(
            engine, max(0, min(idle, max(1, size // 2))), synchronous_commit=synchronous_commit
        )
        self._writer = _WriteBatcher(self._leases)
        self._prefetched = _Prefetched()
        self._known: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()

    @classmethod
    async def open(
        cls,
        url: BackendURL | str,
        options: BackendOptions,
        *,
        serde: SerializerProtocol | None = None,
    ) -> PostgresSaver:
        """Open the saver on ``url`` (creating/upgrading its tables) and register its cleanup."""
        from runstore.sql.migrations import Migration, ensure_schema

        from .engine import shared_engine
        from .settings import PostgresSettings

        url = BackendURL.parse(url)
        url.check_options({"schema"})
        _import_asyncpg()
        engine = await shared_engine(url, options)
        migrations = [Migration(version=i + 1, steps=steps) for i, steps in enumerate(SCHEMA_STEPS)]
        await ensure_schema(engine, COMPONENT, migrations)
        saver = cls(
            engine,
            url=url,
            serde=serde,
            synchronous_commit=options.settings.section(PostgresSettings).saver_synchronous_commit
            == "on",
        )
        options.on_close(saver.aclose)
        return saver

    async def aclose(self) -> None:
        """Give leased connections back to the shared engine (the engine closes with its options)."""
        await self._leases.aclose()

    def __repr__(self) -> str:
        return f"PostgresSaver({self.url})"

    # -- helpers -----------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Mark a write in progress: prefetched histories read meanwhile are not used."""
        self._prefetched.generation += 1
        try:
            yield
        finally:
            self._prefetched.generation += 1

    def _remember(self, key: tuple[str, str, str, str]) -> None:
        known = self._known
        known[key] = None
        known.move_to_end(key)
        if len(known) > self.KNOWN_BLOBS_MAX:
            known.popitem(last=False)

    def _decode_row(self, row: Any) -> CheckpointTuple:
        thread_id = row["thread_id"]
        ns = row["checkpoint_ns"]
        b_channels = row["b_channels"] or ()
        blobs = list(zip(b_channels, row["b_types"] or (), row["b_blobs"] or (), strict=True))
        w_task_ids = row["w_task_ids"]
        writes = (
            list(
                zip(
                    w_task_ids,
                    row["w_channels"],
                    row["w_types"],
                    row["w_blobs"],
                    row["w_paths"],
                    row["w_idxs"],
                    strict=True,
                )
            )
            if w_task_ids
            else None
        )
        return codec.decode_checkpoint(
            self.serde,
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=row["checkpoint_id"],
            parent_checkpoint_id=row["parent_checkpoint_id"],
            type=row["type"],
            checkpoint=row["checkpoint"],
            metadata=row["metadata"],
            blobs=blobs,
            writes=writes,
        )

    # -- async API -----------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the thread's latest without ``checkpoint_id``)."""
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = str(configurable.get("checkpoint_ns") or "")
        checkpoint_id = get_checkpoint_id(config)
        args: tuple[str, ...]
        if checkpoint_id:
            sql, args = GET_BY_ID_SQL, (thread_id, ns, str(checkpoint_id))
        else:
            sql, args = GET_LATEST_SQL, (thread_id, ns)

        async def go(conn: Any) -> Any:
            return await conn.fetchrow(sql, *args)

        generation = self._prefetched.generation
        row = await self._leases.run(go)
        if row is None:
            return None
        need = None if checkpoint_id else row["h_need"]
        if need:
            rows = _walk_range(lambda name: row["h_" + name], row["checkpoint_id"], need)
            if rows is not None:
                key = (thread_id, ns, row["checkpoint_id"])
                self._prefetched.store(key, generation, need, rows)
        return self._decode_row(row)

    def _list_sql(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> tuple[str, list[Any]]:
        wheres: list[str] = []
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if config is not None:
            configurable = config["configurable"]
            wheres.append(f"thread_id = {arg(str(configurable['thread_id']))}")
            ns = configurable.get("checkpoint_ns")
            if ns is not None:
                wheres.append(f"checkpoint_ns = {arg(str(ns))}")
            if checkpoint_id := get_checkpoint_id(config):
                wheres.append(f"checkpoint_id = {arg(str(checkpoint_id))}")
        for term in codec.metadata_filter_terms(filter):
            if term.kind == "number" and not math.isfinite(term.value):
                wheres.append("false")  # JSON holds no NaN/infinity
                continue
            key = f"{arg(term.key)}::text"
            if term.kind == "null":
                wheres.append(f"(metadata -> {key} IS NULL OR metadata -> {key} = 'null'::jsonb)")
            elif term.kind == "bool":
                wheres.append(f"metadata -> {key} = '{'true' if term.value else 'false'}'::jsonb")
            elif term.kind == "number":
                # CASE, not AND: SQL does not promise to test the type before the cast.
                wheres.append(
                    f"(CASE WHEN jsonb_typeof(metadata -> {key}) = 'number'"
                    f" THEN (metadata ->> {key})::numeric = {arg(repr(term.value))}::numeric"
                    " ELSE false END)"
                )
            elif term.kind == "text":
                wheres.append(
                    f"(jsonb_typeof(metadata -> {key}) = 'string'"
                    f" AND metadata ->> {key} = {arg(term.value)})"
                )
            else:
                wheres.append(f"metadata -> {key} = {arg(term.value)}::text::jsonb")
        if before is not None and (before_id := get_checkpoint_id(before)):
            wheres.append(f"checkpoint_id < {arg(str(before_id))}")
        inner = f"SELECT * FROM {CHECKPOINTS}"
        if wheres:
            inner += " WHERE " + " AND ".join(wheres)
        inner += " ORDER BY checkpoint_id DESC"
        if limit is not None:
            inner += f" LIMIT {arg(max(int(limit), 0))}"
        sql = (
            "SELECT "
            + _TUPLE_COLUMNS.format(source=f"({inner}) c")
            + " ORDER BY c.checkpoint_id DESC, c.thread_id, c.checkpoint_ns"
        )
        return sql, args

    async def _list_rows(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[Any]:
        if limit is not None and limit <= 0:
            return []
        sql, args = self._list_sql(config, filter, before, limit)

        async def go(conn: Any) -> list[Any]:
            return list(await conn.fetch(sql, *args))

        return await self._leases.run(go)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, filtered by thread/namespace, metadata and ``before`` in SQL."""
        for row in await self._list_rows(config, filter, before, limit):
            yield self._decode_row(row)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and its new channel values in one statement."""
        enc = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        row = enc.row
        thread_id, ns = row.thread_id, row.checkpoint_ns
        carried = []
        for channel, version in enc.carried.items():
            key = (thread_id, ns, channel, version)
            if key in self._known:
                self._known.move_to_end(key)  # still in use: keep it from eviction
            else:
                carried.append(
                    codec.encode_blob(
                        self.serde, thread_id, ns, channel, version, enc.carried_values[channel]
                    )
                )
        args = (
            *row[:7],
            row.metadata,
            row.value_versions,
            [b.channel for b in enc.blobs],
            [b.version for b in enc.blobs],
            [b.type for b in enc.blobs],
            [b.blob for b in enc.blobs],
            [b.channel for b in carried],
            [b.version for b in carried],
            [b.type for b in carried],
            [b.blob for b in carried],
            codec.dump_json(
                {k: codec.version_text(v) for k, v in checkpoint["channel_versions"].items()}
            ),
        )

        with self._writing():
            await self._writer.run(PUT_SQL, args)
        for b in enc.blobs:
            self._remember((thread_id, ns, b.channel, b.version))
        for b in carried:
            self._remember((thread_id, ns, b.channel, b.version))
        return enc.config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes (first-write-wins; special channels last-write-wins)."""
        if not writes:
            return
        enc = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        # One statement cannot touch a row twice: keep the first of repeated normal
        # slots and the last of repeated special ones.
        rows: dict[int, codec.WriteRow] = {}
        for w in enc.first_wins:
            rows.setdefault(w.idx, w)
        for w in enc.last_wins:
            rows[w.idx] = w
        first = next(iter(rows.values()))
        vals = list(rows.values())
        args = (
            first.thread_id,
            first.checkpoint_ns,
            first.checkpoint_id,
            str(task_id),
            task_path,
            [w.idx for w in vals],
            [w.channel for w in vals],
            [w.type for w in vals],
            [w.value for w in vals],
        )

        with self._writing():
            await self._writer.run(PUT_WRITES_SQL, args)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of ``thread_id`` (all namespaces)."""

        async def go(conn: Any) -> None:
            await conn.execute(DELETE_THREAD_SQL, [str(thread_id)])

        with self._writing():
            await self._leases.run(go)
        self._known.clear()

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy the whole source thread (every checkpoint with its values and writes) in one statement."""
        src, dst = str(source_thread_id), str(target_thread_id)
        if src == dst:
            return

        async def go(conn: Any) -> None:
            await conn.execute(COPY_THREAD_SQL, src, dst)

        with self._writing():
            await self._leases.run(go)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``delete`` drops them; ``keep_latest`` keeps each namespace's head and
        the ancestors (with their writes) its delta channels are rebuilt from."""
        ids = [str(t) for t in thread_ids]
        if strategy == "delete":
            if ids:

                async def drop(conn: Any) -> None:
                    await conn.execute(DELETE_THREAD_SQL, ids)

                with self._writing():
                    await self._leases.run(drop)
                self._known.clear()
            return
        if strategy != "keep_latest":
            raise ValueError(
                f"unknown prune strategy {strategy!r}; expected 'keep_latest' or 'delete'"
            )
        if not ids:
            return

        async def go(conn: Any) -> None:
            # One snapshot for the keep set and the deletes; checkpoints a running graph
            # saves meanwhile are newer than our snapshot and never touched.
            async with conn.transaction(isolation="repeatable_read"):
                keep: dict[tuple[str, str], list[str]] = {}
                for r in await conn.fetch(PRUNE_KEEP_SQL, ids):
                    keep.setdefault((r[0], r[1]), []).append(r[2])
                for (thread_id, ns), kept in keep.items():
                    doomed = await conn.fetch(
                        f"SELECT checkpoint_id FROM {CHECKPOINTS} WHERE thread_id = $1"
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
                    await conn.execute(DELETE_CHECKPOINTS_SQL, thread_id, ns, gone)
                    await conn.execute(DELETE_GARBAGE_BLOBS_SQL, thread_id, ns)

        with self._writing():
            await self._leases.run(go)
        self._known.clear()

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by ``run_ids``, except those a
        surviving checkpoint still rebuilds delta channels from."""
        ids = [str(r) for r in run_ids]
        if not ids:
            return

        async def go(conn: Any) -> None:
            async with conn.transaction(isolation="repeatable_read"):
                doomed: dict[tuple[str, str], list[str]] = {}
                for r in await conn.fetch(RUNS_KEEP_SQL, ids):
                    if not r["needed"]:
                        doomed.setdefault((r[0], r[1]), []).append(r[2])
                for (thread_id, ns), gone in doomed.items():
                    await conn.execute(DELETE_CHECKPOINTS_SQL, thread_id, ns, gone)
                    await conn.execute(DELETE_GARBAGE_BLOBS_SQL, thread_id, ns)

        with self._writing():
            await self._leases.run(go)
        self._known.clear()

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel seed and ancestor writes, from one recursive query over parent links."""
        if not channels:
            return {}
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = str(configurable.get("checkpoint_ns") or "")
        checkpoint_id = get_checkpoint_id(config)
        wanted = list(dict.fromkeys(channels))
        if checkpoint_id:
            ready = self._prefetched.take((thread_id, ns, str(checkpoint_id)), wanted)
            if ready is not None:
                # Decoded here, per call: callers never share value objects.
                return codec.assemble_delta_history(self.serde, channels, ready)

        target = str(checkpoint_id) if checkpoint_id else None
        rows: list[Any] | None = None
        if len(wanted) <= _MAX_MASK_CHANNELS:

            async def by_range(conn: Any) -> Any:
                return await conn.fetchrow(RANGE_HISTORY_SQL, thread_id, ns, target, wanted)

            found = await self._leases.run(by_range)
            rows = _walk_range(found.__getitem__, found["target_id"], wanted)
        if rows is None:

            async def by_parent_links(conn: Any) -> list[Any]:
                return list(await conn.fetch(DELTA_HISTORY_SQL, thread_id, ns, target, wanted))

            rows = await self._leases.run(by_parent_links)
        return codec.assemble_delta_history(self.serde, channels, rows)

    # -- sync twins ------------------------------------------------------------------

    def _sync(self, method: str, factory: Callable[[], Coroutine[Any, Any, R]]) -> R:
        return run_sync(self.loop, factory, method, type(self).__name__)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync twin of `aget_tuple` (call from a thread other than the saver's loop)."""
        return self._sync("get_tuple", lambda: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync twin of `alist` (call from a thread other than the saver's loop)."""
        # Check eagerly: a generator would only fail at its first next().
        ensure_off_loop(self.loop, "list", type(self).__name__)
        rows = self._sync("list", lambda: self._list_rows(config, filter, before, limit))
        return (self._decode_row(row) for row in rows)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync twin of `aput`."""
        return self._sync("put", lambda: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync twin of `aput_writes`."""
        self._sync("put_writes", lambda: self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Sync twin of `adelete_thread`."""
        self._sync("delete_thread", lambda: self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync twin of `adelete_for_runs`."""
        self._sync("delete_for_runs", lambda: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync twin of `acopy_thread`."""
        self._sync("copy_thread", lambda: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync twin of `aprune`."""
        self._sync("prune", lambda: self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Sync twin of `aget_delta_channel_history`."""
        return self._sync(
            "get_delta_channel_history",
            lambda: self.aget_delta_channel_history(config=config, channels=channels),
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Next channel version: the stock savers' zero-padded counter plus a random fraction."""
        return codec.next_version(current)
