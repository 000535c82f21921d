"""Schema, migrations and SQL text of the sqlite checkpoint saver.

Tables and columns are the ones every runstore SQL saver stores
(`runstore.checkpoint.codec`: `CheckpointRow`, `BlobRow`, `WriteRow`), in sqlite's
types. Statements insert whole rows in that column order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import get_checkpoint_id

from runstore.checkpoint import codec
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.filters import FilterTerm, filter_terms
from runstore.checkpoint.rules import THREAD_ID_METADATA_KEY, checked_text
from runstore.checkpoint.threads import (
    THREADS,
    ThreadQuery,
    backfill_sql,
    footprint_sql,
    refresh_sql,
    status_case,
    stronger_status_sql,
)
from runstore.clock import system_clock, to_micros
from runstore.sql.migrations import Migration

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "JSON_EQUAL_FUNCTION",
    "SCHEMA_COMPONENT",
    "SCHEMA_MIGRATIONS",
    "filter_clauses",
    "list_where",
]

#: Component name of this saver's schema in ``runstore_schema_versions``.
SCHEMA_COMPONENT = "sqlite-saver"

#: One row per thread (`runstore.checkpoint.threads`); times in microseconds since the
#: epoch. ``fence`` and ``deleted_at`` serve fenced writes and the deletion tombstone.
THREADS_TABLE = f"""CREATE TABLE IF NOT EXISTS {THREADS} (
    thread_id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    touched_at INTEGER NOT NULL,
    latest_checkpoint_id TEXT,
    metadata TEXT NOT NULL DEFAULT '{{}}',
    status TEXT NOT NULL DEFAULT 'idle',
    checkpoints INTEGER NOT NULL DEFAULT 0,
    writes INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    oldest_at INTEGER,
    retention TEXT,
    swept_at INTEGER,
    sweep_after INTEGER,
    claimed_until INTEGER,
    fence INTEGER NOT NULL DEFAULT 0,
    deleted_at INTEGER
)"""
THREADS_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {THREADS}_updated ON {THREADS} (updated_at, thread_id)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_created ON {THREADS} (created_at, thread_id)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_status ON {THREADS} (status, updated_at, thread_id)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_touched ON {THREADS} (touched_at)"
    " WHERE deleted_at IS NULL",
    f"CREATE INDEX IF NOT EXISTS {THREADS}_deleted ON {THREADS} (deleted_at)"
    " WHERE deleted_at IS NOT NULL",
]


async def _thread_index(conn: AsyncConnection) -> None:
    """Version 4: the thread index, back-filled; ``created_at`` on checkpoints (rows
    stored before get the migration's time: their age counts from the upgrade)."""
    now = to_micros(system_clock())
    await conn.exec_driver_sql(
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN created_at INTEGER NOT NULL DEFAULT {now}"
    )
    await conn.exec_driver_sql(THREADS_TABLE)
    for statement in THREADS_INDEXES:
        await conn.exec_driver_sql(statement)
    await conn.exec_driver_sql(
        backfill_sql(
            now, metadata_text="x.metadata", checkpoints=CHECKPOINTS, blobs=BLOBS, writes=WRITES
        )
    )


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
                checkpoint BLOB NOT NULL,
                metadata TEXT NOT NULL DEFAULT '{{}}',
                value_versions TEXT NOT NULL DEFAULT '{{}}',
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {BLOBS} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                channel TEXT NOT NULL,
                version TEXT NOT NULL,
                type TEXT NOT NULL,
                blob BLOB,
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
                value BLOB,
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            )""",
        ],
        "checkpoints, channel blobs and pending writes",
    ),
    Migration(
        2,
        [
            f"CREATE INDEX IF NOT EXISTS {CHECKPOINTS}_run_id "
            f"ON {CHECKPOINTS} (run_id) WHERE run_id IS NOT NULL",
        ],
        "run_id index for delete_for_runs",
    ),
    Migration(
        3,
        [
            # NULL on rows stored before this version: "versions unknown", which the
            # ancestor rule reads as "every named delta channel has one" (keeps more).
            f"ALTER TABLE {CHECKPOINTS} ADD COLUMN channel_versions TEXT",
            f"ALTER TABLE {WRITES} RENAME COLUMN value TO blob",
        ],
        "the columns of the PostgreSQL saver: channel_versions, writes.blob",
    ),
    Migration(4, [_thread_index], "the thread index, checkpoints.created_at"),
    # Every write updates its thread's record, and sqlite rewrites the entries of each
    # index over a changed column; no statement searches by `touched_at` (the sweep
    # walks thread ids in order), so its index only cost writes.
    Migration(5, [f"DROP INDEX IF EXISTS {THREADS}_touched"], "no index on threads.touched_at"),
]

_RECORD_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
    "metadata, value_versions, channel_versions"
)
#: A fetched record's columns, in this order (`RecordRow`).
SELECT_RECORD = f"SELECT {_RECORD_COLUMNS} FROM {CHECKPOINTS} c"
SELECT_BLOBS = (
    f"SELECT j.key, b.type, b.blob FROM json_each(?) j JOIN {BLOBS} b "
    "ON b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = j.key AND b.version = j.value"
)
SELECT_WRITES = (
    f"SELECT task_id, channel, type, blob, task_path, idx FROM {WRITES} "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
#: A checkpoint row's columns: the codec's, then ``created_at`` (the saver's clock at
#: its first put; a re-put keeps it).
CHECKPOINT_COLUMNS = (*codec.CheckpointRow._fields, "created_at")
# A put inserts its checkpoint (`INSERT OR IGNORE`: the row count says whether it is new,
# which the thread record's counters need) and only a re-put replaces the fields.
INSERT_CHECKPOINT = (
    f"INSERT OR IGNORE INTO {CHECKPOINTS} ({', '.join(CHECKPOINT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(CHECKPOINT_COLUMNS))})"
)
REPLACE_CHECKPOINT = (
    f"UPDATE {CHECKPOINTS} SET "
    + ", ".join(f"{c} = ?" for c in codec.CheckpointRow._fields[3:])
    + " WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
CHECKPOINT_OF_THREAD = f"SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = ? LIMIT 1"
WRITE_EXISTS = (
    f"SELECT 1 FROM {WRITES} WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "AND task_id = ? AND idx = ?"
)
INSERT_BLOB = (
    f"INSERT OR REPLACE INTO {BLOBS} ({', '.join(codec.BlobRow._fields)}) "
    f"VALUES ({', '.join('?' * len(codec.BlobRow._fields))})"
)
MISSING_BLOBS = (
    f"SELECT j.key FROM json_each(?) j WHERE NOT EXISTS (SELECT 1 FROM {BLOBS} b "
    "WHERE b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = j.key AND b.version = j.value)"
)
_WRITE_COLUMNS = ", ".join(codec.WriteRow._fields)
_WRITE_VALUES = ", ".join("?" * len(codec.WriteRow._fields))
INSERT_WRITE_FIRST = f"INSERT OR IGNORE INTO {WRITES} ({_WRITE_COLUMNS}) VALUES ({_WRITE_VALUES})"
INSERT_WRITE_LAST = f"INSERT OR REPLACE INTO {WRITES} ({_WRITE_COLUMNS}) VALUES ({_WRITE_VALUES})"

#: The columns a pruning graph reads (`runstore.checkpoint.retention.CheckpointGraph`).
SELECT_GRAPH = (
    "SELECT checkpoint_id, parent_checkpoint_id, run_id, metadata, value_versions, "
    f"channel_versions, created_at FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_ns = ?"
)


#: The copied checkpoint's metadata: its thread id renamed to the target's
#: (`runstore.checkpoint.rules.renamed_thread_metadata`); ``?1`` target, ``?2`` source.
_COPIED_METADATA = (
    f"CASE WHEN json_extract(metadata, '$.{THREAD_ID_METADATA_KEY}') = ?2 "
    f"THEN json_set(metadata, '$.{THREAD_ID_METADATA_KEY}', ?1) ELSE metadata END"
)


def copy_thread_statements() -> list[str]:
    """One ``INSERT ... SELECT`` per table copying a thread (params: target, source);
    on a key present in both threads the source's row wins."""
    out = []
    for table, columns in (
        (CHECKPOINTS, CHECKPOINT_COLUMNS),
        (BLOBS, codec.BlobRow._fields),
        (WRITES, codec.WriteRow._fields),
    ):
        rest = ", ".join(_COPIED_METADATA if c == "metadata" else c for c in columns[1:])
        out.append(
            f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
            f"SELECT ?1, {rest} FROM {table} WHERE thread_id = ?2"
        )
    return out


#: Requested channels answered per delta-history statement (bits of a 64-bit mask).
MAX_MASK_CHANNELS = 62
#: Upper bound on the parent links one delta-history statement follows (cycle guard).
MAX_DEPTH = 1_000_000

# One statement answers the whole delta history. `chain` follows parent links from
# the target (depth 0); `seen` is a bit mask of the requested channels already held
# by a shallower ancestor (depths 1..depth-1), so a row contributes channel `bit`
# while `seen & bit = 0`: its writes, and its blob when it holds a value. Recursion
# stops once every channel is seen, or when a parent link leads back to the target (a
# cycle left by re-putting an id under its own descendant). CROSS JOIN pins the chain
# as the outer loop, so each step is one primary-key probe.
DELTA_SQL = f"""
WITH RECURSIVE
  req(bit, ch) AS (SELECT 1 << CAST(key AS INTEGER), value FROM json_each(:channels)),
  chain(depth, cid, parent, vv, seen, root) AS (
    SELECT 0, checkpoint_id, parent_checkpoint_id, value_versions, 0, checkpoint_id
      FROM {CHECKPOINTS}
     WHERE thread_id = :thread_id AND checkpoint_ns = :ns
       AND checkpoint_id = coalesce(:checkpoint_id, (
             SELECT max(checkpoint_id) FROM {CHECKPOINTS}
              WHERE thread_id = :thread_id AND checkpoint_ns = :ns))
    UNION ALL
    SELECT chain.depth + 1, c.checkpoint_id, c.parent_checkpoint_id, c.value_versions,
           chain.seen | CASE WHEN chain.depth = 0 THEN 0 ELSE (
               SELECT coalesce(sum(req.bit), 0) FROM req JOIN json_each(chain.vv) j
                   ON j.key = req.ch) END,
           chain.root
      FROM chain CROSS JOIN {CHECKPOINTS} c
        ON c.thread_id = :thread_id AND c.checkpoint_ns = :ns
       AND c.checkpoint_id = chain.parent
     WHERE chain.seen != :full AND chain.depth < :max_depth AND chain.parent != chain.root
  )
SELECT chain.depth, req.ch, {codec.HISTORY_WRITE}, w.task_id, w.task_path, w.idx, w.type, w.blob
  FROM chain CROSS JOIN req CROSS JOIN {WRITES} w
    ON w.thread_id = :thread_id AND w.checkpoint_ns = :ns
   AND w.checkpoint_id = chain.cid AND w.channel = req.ch
 WHERE chain.depth > 0 AND (chain.seen & req.bit) = 0
UNION ALL
SELECT chain.depth, req.ch, {codec.HISTORY_SEED}, NULL, NULL, NULL, b.type, b.blob
  FROM chain CROSS JOIN req CROSS JOIN json_each(chain.vv) j CROSS JOIN {BLOBS} b
    ON b.thread_id = :thread_id AND b.checkpoint_ns = :ns
   AND b.channel = req.ch AND b.version = j.value
 WHERE chain.depth > 0 AND (chain.seen & req.bit) = 0 AND j.key = req.ch
"""

#: SQL function every saver connection registers (`ops.register_functions`): whether
#: stored JSON text equals a filter document under `filters.json_equal`.
JSON_EQUAL_FUNCTION = "runstore_json_equal"


def list_where(
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
) -> tuple[list[str], list[Any]]:
    """SQL conditions (sqlite JSON1 dialect) and parameters for `alist`.

    ``thread_id``, ``checkpoint_ns`` and ``checkpoint_id`` in ``config`` each narrow
    the result when present; metadata filters follow `runstore.checkpoint.filters`.
    """
    clauses: list[str] = []
    params: list[Any] = []
    configurable = (config or {}).get("configurable") or {}
    if configurable.get("thread_id") is not None:
        clauses.append("c.thread_id = ?")
        params.append(checked_text(configurable["thread_id"], "config['configurable']['thread_id']"))
    if configurable.get("checkpoint_ns") is not None:
        clauses.append("c.checkpoint_ns = ?")
        params.append(checked_text(configurable["checkpoint_ns"], "checkpoint_ns", empty_ok=True))
    if checkpoint_id := configurable.get("checkpoint_id"):
        clauses.append("c.checkpoint_id = ?")
        params.append(checked_text(checkpoint_id, "checkpoint_id"))
    where, args = filter_clauses(filter_terms(filter), "c.metadata")
    clauses.extend(where)
    params.extend(args)
    if before is not None and (before_id := get_checkpoint_id(before)):
        clauses.append("c.checkpoint_id < ?")
        params.append(checked_text(before_id, "before checkpoint_id"))
    return clauses, params


def filter_clauses(terms: list[FilterTerm], column: str) -> tuple[list[str], list[Any]]:
    """SQL conditions (sqlite JSON1) and parameters matching the JSON text in ``column``
    by the metadata filter rule (`runstore.checkpoint.filters`)."""
    clauses: list[str] = []
    params: list[Any] = []
    for term in terms:
        probe = f"SELECT 1 FROM json_each({column}) m WHERE m.key = ?"
        if term.kind == "null":
            clauses.append(f"NOT EXISTS ({probe} AND m.type != 'null')")
            params.append(term.key)
        elif term.kind == "never":
            clauses.append("0")
        elif term.kind == "number":
            clauses.append(f"EXISTS ({probe} AND m.type IN ('integer', 'real') AND m.atom = ?)")
            params.extend((term.key, term.value))
        elif term.kind == "bool":
            clauses.append(f"EXISTS ({probe} AND m.type = ?)")
            params.extend((term.key, term.json_type))
        elif term.kind == "text":
            clauses.append(f"EXISTS ({probe} AND m.type = 'text' AND m.atom = ?)")
            params.extend((term.key, term.value))
        else:
            # Documents compare by the shared rule (numbers by value, keys unordered),
            # which plain text equality of the stored JSON would not give.
            clauses.append(
                f"EXISTS ({probe} AND m.type = ? AND {JSON_EQUAL_FUNCTION}(m.value, ?))"
            )
            params.extend((term.key, term.json_type, term.json_text))
    return clauses, params


# --------------------------------------------------------------------------- thread index

#: The columns of a `ThreadInfo`, in `runstore.checkpoint.threads.thread_info` order.
THREAD_INFO_COLUMNS = (
    "thread_id, created_at, updated_at, touched_at, latest_checkpoint_id, checkpoints, "
    "writes, bytes, status, metadata, retention"
)
#: A thread as the index shows it: live (no tombstone) and holding a checkpoint.
LIVE_THREAD = "deleted_at IS NULL AND checkpoints > 0"
SELECT_THREAD = f"SELECT {THREAD_INFO_COLUMNS} FROM {THREADS} WHERE thread_id = ? AND {LIVE_THREAD}"
#: A thread's tombstone time (NULL: live), if it has a record.
THREAD_DELETED_AT = f"SELECT deleted_at FROM {THREADS} WHERE thread_id = ?"
HEAD_SPECIAL_CHANNELS = (
    f"SELECT channel FROM {WRITES} WHERE thread_id = ? AND checkpoint_ns = '' "
    "AND checkpoint_id = ? AND idx < 0"
)

# A thread's first checkpoint, or the first after its tombstone (a new history): the
# record starts over; only `fence` survives a deletion.
START_THREAD = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, latest_checkpoint_id,
                       metadata, status, checkpoints, writes, bytes, oldest_at)
VALUES (:thread_id, :now, :now, :now, :latest, :metadata, :status, :added, 0, :bytes, :now)
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = excluded.created_at, updated_at = excluded.updated_at,
    touched_at = excluded.touched_at, latest_checkpoint_id = excluded.latest_checkpoint_id,
    metadata = excluded.metadata, status = excluded.status, checkpoints = excluded.checkpoints,
    writes = 0, bytes = excluded.bytes, oldest_at = excluded.oldest_at, retention = NULL,
    swept_at = NULL, sweep_after = NULL, claimed_until = NULL, deleted_at = NULL
"""
# A checkpoint of a live thread, in one statement (no read of the record first): the
# checkpoint is the thread's new head when it is a root one not older than the latest,
# and the head's status comes from its stored special writes (they may precede it).
# No row changes when the thread has no record or a tombstone (`ops.put` then starts it).
_IS_HEAD = "(:ns = '' AND (latest_checkpoint_id IS NULL OR :checkpoint_id >= latest_checkpoint_id))"
_HEAD_STATUS = status_case(
    lambda ch: (
        f"EXISTS (SELECT 1 FROM {WRITES} x WHERE x.thread_id = :thread_id"
        f" AND x.checkpoint_ns = '' AND x.checkpoint_id = :checkpoint_id AND x.idx < 0"
        f" AND x.channel = '{ch}')"
    )
)
# Every write also clears `swept_at`: "written since its last sweep" must not depend on
# clocks, or a write whose time was taken before a concurrent sweep (in another process)
# committed after it would look swept and wait for `sweep_after`.
PUT_THREAD = f"""
UPDATE {THREADS} SET
    updated_at = max(updated_at, :now), touched_at = max(touched_at, :now), swept_at = NULL,
    checkpoints = checkpoints + :added, bytes = bytes + :bytes,
    oldest_at = CASE WHEN :added THEN coalesce(min(oldest_at, :now), :now) ELSE oldest_at END,
    latest_checkpoint_id = CASE WHEN {_IS_HEAD} THEN :checkpoint_id ELSE latest_checkpoint_id END,
    metadata = CASE WHEN {_IS_HEAD} THEN :metadata ELSE metadata END,
    status = CASE WHEN {_IS_HEAD} THEN {_HEAD_STATUS} ELSE status END
WHERE thread_id = :thread_id AND deleted_at IS NULL
"""
# Writes (possibly before their thread's first checkpoint: the row then starts empty).
# No row changes when the thread has a tombstone (the writes are then refused).
_WRITES_THREAD = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, writes, bytes, status)
VALUES (:thread_id, :now, :now, :now, :added, :bytes, 'idle')
ON CONFLICT (thread_id) DO UPDATE SET
    writes = writes + excluded.writes, bytes = bytes + excluded.bytes,
    touched_at = max(touched_at, excluded.touched_at), swept_at = NULL{{status}}
WHERE deleted_at IS NULL
"""
# Writes that leave the status alone (no error or interrupt among them, the common
# case). SQLite rewrites an index entry whenever its column is in the SET list, changed
# or not, so leaving `status` out spares the status index on every such call.
WRITES_THREAD = _WRITES_THREAD.format(status="")
# Special writes on the latest root checkpoint can raise its status.
WRITES_THREAD_STATUS = _WRITES_THREAD.format(
    status=f""",
    status = CASE WHEN :ns = '' AND latest_checkpoint_id = :checkpoint_id
                  THEN {stronger_status_sql("status", ":status")} ELSE status END"""
)
# A fenced call's compare-and-set, first in its write transaction: the thread's fence
# rises to :fence unless it is already higher (then no row changes: the call is refused
# and rolled back). A thread without a record gets one (not live until it holds a
# checkpoint), so the token is remembered before the thread's first write.
FENCE_THREAD = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, fence)
VALUES (:thread_id, :now, :now, :now, :fence)
ON CONFLICT (thread_id) DO UPDATE SET fence = excluded.fence WHERE fence <= excluded.fence
"""
FENCE_OF = f"SELECT fence FROM {THREADS} WHERE thread_id = ?"
# The deletion tombstone: the record stays (keeping `fence`) so late writes are refused.
TOMBSTONE_THREAD = f"""
UPDATE {THREADS} SET deleted_at = :now, updated_at = :now, touched_at = :now,
    latest_checkpoint_id = NULL, metadata = '{{}}', status = 'idle', checkpoints = 0,
    writes = 0, bytes = 0, oldest_at = NULL, retention = NULL, swept_at = NULL,
    sweep_after = NULL, claimed_until = NULL
WHERE thread_id = :thread_id
"""
#: Rows and bytes a thread holds per table (a dry run of its deletion).
THREAD_FOOTPRINT = footprint_sql(
    ":thread_id", metadata_text="x.metadata", checkpoints=CHECKPOINTS, blobs=BLOBS, writes=WRITES
)
#: After rows of a thread were deleted or copied in bulk: the record from its rows (exact;
#: sqlite writers are serialized, so nothing changes the rows meanwhile).
REFRESH_THREAD = refresh_sql(
    ":thread_id", metadata_text="x.metadata", checkpoints=CHECKPOINTS, blobs=BLOBS, writes=WRITES
)
# A copy target becomes a live thread (reviving a tombstone: copying is deliberate).
ENSURE_THREAD = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at)
VALUES (:thread_id, :now, :now, :now)
ON CONFLICT (thread_id) DO UPDATE SET
    created_at = CASE WHEN deleted_at IS NULL THEN created_at ELSE excluded.created_at END,
    updated_at = max(updated_at, excluded.updated_at),
    touched_at = max(touched_at, excluded.touched_at), deleted_at = NULL
"""


def list_threads_sql(query: ThreadQuery) -> tuple[str, list[Any]]:
    """The `list_threads` statement (one page, newest first) and its parameters."""
    clauses = [LIVE_THREAD]
    params: list[Any] = []
    if query.status is not None:
        clauses.append("status = ?")
        params.append(query.status)
    if query.updated_after is not None:
        clauses.append("updated_at > ?")
        params.append(query.updated_after)
    if query.updated_before is not None:
        clauses.append("updated_at < ?")
        params.append(query.updated_before)
    where, args = filter_clauses(query.terms, "metadata")
    clauses.extend(where)
    params.extend(args)
    order = query.order_by
    if query.after is not None:
        clauses.append(f"({order}, thread_id) < (?, ?)")
        params.extend(query.after)
    params.append(query.limit)
    statement = (
        f"SELECT {THREAD_INFO_COLUMNS} FROM {THREADS} WHERE {' AND '.join(clauses)} "
        f"ORDER BY {order} DESC, thread_id DESC LIMIT ?"
    )
    return statement, params


# --------------------------------------------------------------------------- retention

# The threads a sweep looks at next, by thread id after the cursor: live threads some
# limit may touch that were not swept since their last write (or are due again), and
# tombstones whose events and stream keys are not deleted yet (`swept_at` unset);
# never one another sweeper holds a live claim on. Unset limits are NULL (never true).
# A thread idle past the TTL is always due; otherwise one swept since its last write is
# looked at again when its `sweep_after` comes, or on a rescan (the policy changed).
SWEEP_CANDIDATES = f"""
SELECT thread_id, deleted_at IS NOT NULL FROM {THREADS}
WHERE thread_id > :after AND (claimed_until IS NULL OR claimed_until <= :now)
  AND (:only IS NULL OR thread_id IN (SELECT value FROM json_each(:only))) AND (
    (deleted_at IS NULL AND checkpoints > 0
     AND (touched_at <= :idle_cutoff
          OR ((retention IS NOT NULL OR checkpoints > :keep_last OR oldest_at <= :age_cutoff)
              AND (:rescan OR swept_at IS NULL OR touched_at > swept_at
                   OR sweep_after <= :now))))
    OR (deleted_at IS NOT NULL AND swept_at IS NULL))
ORDER BY thread_id LIMIT :limit
"""
CLAIM_THREADS = (
    f"UPDATE {THREADS} SET claimed_until = ? WHERE thread_id IN (SELECT value FROM json_each(?))"
)
#: What a sweep of one thread reads first (inside its write transaction).
SWEEP_STATE = f"SELECT deleted_at, checkpoints, touched_at, retention FROM {THREADS} WHERE thread_id = ?"
SWEPT_THREAD = f"""
UPDATE {THREADS} SET swept_at = :now, sweep_after = :sweep_after, claimed_until = NULL
WHERE thread_id = :thread_id
"""
#: Tombstones whose other stores were cleaned: the sweeper is done with them.
CLEANED_THREADS = f"""
UPDATE {THREADS} SET swept_at = ?, claimed_until = NULL
WHERE thread_id IN (SELECT value FROM json_each(?)) AND deleted_at IS NOT NULL
"""
NAMESPACES_OF_THREAD = f"SELECT DISTINCT checkpoint_ns FROM {CHECKPOINTS} WHERE thread_id = ?"
# Overrides on a live thread (a record without checkpoints yet is created to hold them).
SET_RETENTION = f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, retention)
VALUES (:thread_id, :now, :now, :now, :retention)
ON CONFLICT (thread_id) DO UPDATE SET retention = excluded.retention, swept_at = NULL
WHERE deleted_at IS NULL
"""
#: A read that counts as activity (`SqliteSaver.atouch_thread`): idle_ttl restarts.
TOUCH_THREAD = (
    f"UPDATE {THREADS} SET touched_at = max(touched_at, ?) WHERE thread_id = ? AND deleted_at IS NULL"
)
