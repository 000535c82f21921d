"""Schema of the SQL event store: one table, its indexes, and versioned migrations per dialect.

Version 1: ``runstore_events`` keyed by ``(thread_id, seq)``; a partial index on
message rows for message pages; a ``(thread_id, run_id, seq)`` index for per-run
reads. Version 2: derived columns ``task_id`` (``metadata.task_id`` when a str) and
``visible_ai`` (`runstore.records.is_visible_ai_message`), backfilled in SQL, so those
filters never decode rows.
"""

from __future__ import annotations

from ..events import AI_MESSAGE_EVENT_TYPES, HIDDEN_CALLER_PREFIX
from .migrations import Migration

TABLE = "runstore_events"
COMPONENT = "events"

#: Column order of every row the store inserts and of the records it reads.
INSERT_COLUMNS = (
    "thread_id", "seq", "run_id", "event_type", "category", "content", "content_json",
    "metadata", "created_at", "user_id", "task_id", "visible_ai",
)  # fmt: skip
RECORD_COLUMNS = (
    "thread_id, seq, run_id, event_type, category, content, content_json, metadata, "
    "created_at, user_id"
)

_AI_TYPES_SQL = ", ".join(f"'{name}'" for name in AI_MESSAGE_EVENT_TYPES)

_V1_TABLE = f"""CREATE TABLE {TABLE} (
    thread_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    event_type VARCHAR(32) NOT NULL,
    category VARCHAR(16) NOT NULL,
    content TEXT NOT NULL,
    content_json BOOLEAN NOT NULL,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL,
    user_id TEXT,
    PRIMARY KEY (thread_id, seq)
)"""
_V1_MESSAGES_INDEX = (
    f"CREATE INDEX {TABLE}_messages ON {TABLE} (thread_id, seq) WHERE category = 'message'"
)
_V1_RUN_INDEX = f"CREATE INDEX {TABLE}_run ON {TABLE} (thread_id, run_id, seq)"

_V2_ADD_TASK = f"ALTER TABLE {TABLE} ADD COLUMN task_id TEXT"
_V2_ADD_VISIBLE = f"ALTER TABLE {TABLE} ADD COLUMN visible_ai BOOLEAN NOT NULL DEFAULT FALSE"

SQLITE_MIGRATIONS: list[Migration] = [
    Migration(1, [_V1_TABLE, _V1_MESSAGES_INDEX, _V1_RUN_INDEX], "events table and indexes"),
    Migration(
        2,
        [
            _V2_ADD_TASK,
            _V2_ADD_VISIBLE,
            # Backfill the derived columns from the stored JSON metadata.
            f"UPDATE {TABLE} SET task_id = json_extract(metadata, '$.task_id') "
            "WHERE json_type(metadata, '$.task_id') = 'text'",
            f"UPDATE {TABLE} SET visible_ai = 1 WHERE category = 'message' "
            f"AND event_type IN ({_AI_TYPES_SQL}) AND NOT coalesce("
            "json_type(metadata, '$.caller') = 'text' AND "
            f"substr(json_extract(metadata, '$.caller'), 1, {len(HIDDEN_CALLER_PREFIX)}) = "
            f"'{HIDDEN_CALLER_PREFIX}', 0)",
        ],
        "task_id and visible_ai columns for filters in SQL",
    ),
]

POSTGRES_MIGRATIONS: list[Migration] = [
    Migration(1, [_V1_TABLE, _V1_MESSAGES_INDEX, _V1_RUN_INDEX], "events table and indexes"),
    Migration(
        2,
        [
            _V2_ADD_TASK,
            _V2_ADD_VISIBLE,
            f"UPDATE {TABLE} SET task_id = metadata::jsonb ->> 'task_id' "
            "WHERE jsonb_typeof(metadata::jsonb -> 'task_id') = 'string'",
            f"UPDATE {TABLE} SET visible_ai = TRUE WHERE category = 'message' "
            f"AND event_type IN ({_AI_TYPES_SQL}) AND NOT coalesce("
            "jsonb_typeof(metadata::jsonb -> 'caller') = 'string' AND "
            f"left(metadata::jsonb ->> 'caller', {len(HIDDEN_CALLER_PREFIX)}) = "
            f"'{HIDDEN_CALLER_PREFIX}', FALSE)",
        ],
        "task_id and visible_ai columns for filters in SQL",
    ),
]
