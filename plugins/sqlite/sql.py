"""Schema, migrations and SQL text of the sqlite checkpoint saver.

Tables and columns are the ones every runstore SQL saver stores
(`runstore.checkpoint.codec`: `CheckpointRow`, `BlobRow`, `WriteRow`), in sqlite's
types. Statements insert whole rows in that column order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import get_checkpoint_id

from runstore.checkpoint import codec
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.filters import filter_terms
from runstore.checkpoint.saverbase import checked_text
from runstore.sql.migrations import Migration

__all__ = ["SCHEMA_COMPONENT", "SCHEMA_MIGRATIONS", "JSON_EQUAL_FUNCTION", "list_where"]

#: Component name of this saver's schema in ``runstore_schema_versions``.
SCHEMA_COMPONENT = "sqlite-saver"

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
INSERT_CHECKPOINT = (
    f"INSERT OR REPLACE INTO {CHECKPOINTS} ({', '.join(codec.CheckpointRow._fields)}) "
    f"VALUES ({', '.join('?' * len(codec.CheckpointRow._fields))})"
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

#: The columns the pruning graph reads (`ops.Graph`).
SELECT_GRAPH = (
    "SELECT checkpoint_id, parent_checkpoint_id, run_id, metadata, value_versions, "
    f"channel_versions FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_ns = ?"
)


def copy_thread_statements() -> list[str]:
    """One ``INSERT ... SELECT`` per table copying a thread (params: target, source);
    on a key present in both threads the source's row wins."""
    out = []
    for table, columns in (
        (CHECKPOINTS, codec.CheckpointRow._fields),
        (BLOBS, codec.BlobRow._fields),
        (WRITES, codec.WriteRow._fields),
    ):
        rest = ", ".join(columns[1:])
        out.append(
            f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
            f"SELECT ?, {rest} FROM {table} WHERE thread_id = ?"
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
    for term in filter_terms(filter):
        probe = "SELECT 1 FROM json_each(c.metadata) m WHERE m.key = ?"
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
    if before is not None and (before_id := get_checkpoint_id(before)):
        clauses.append("c.checkpoint_id < ?")
        params.append(checked_text(before_id, "before checkpoint_id"))
    return clauses, params
