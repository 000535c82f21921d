"""Schema of the SQL event store: one table, its indexes, and versioned migrations per dialect.

Version 1: ``runstore_events`` keyed by ``(thread_id, seq)``; a partial index on
message rows for message pages; a ``(thread_id, run_id, seq)`` index for per-run
reads. Version 2: derived columns ``task_id`` (``metadata.task_id`` when a str) and
``visible_ai`` (`runstore.records.is_visible_ai_message`), backfilled in SQL, so those
filters never decode rows. The DDL is portable; each dialect's plugin supplies the
backfill (`events_migrations`), which needs its JSON functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from runstore.events.protocol import AI_MESSAGE_EVENT_TYPES
from runstore.sql.migrations import Migration, Step

TABLE = "runstore_events"
#: Per thread, the highest fencing token an append carried (version 3; kept across deletes).
FENCES = "runstore_event_fences"
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

#: The AI message event types as a SQL list of literals, for `IN (...)`.
AI_TYPES_SQL = ", ".join(f"'{name}'" for name in AI_MESSAGE_EVENT_TYPES)

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

_V3_FENCES = f"CREATE TABLE {FENCES} (thread_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)"



def events_migrations(backfill_v2: Sequence[Step]) -> list[Migration]:
    """The event store's migrations on one dialect, given its version-2 backfill steps.

    Versions 1 and 2 are portable SQL; only the backfill of the derived columns from
    the stored JSON metadata needs the dialect's JSON functions. The steps must set
    ``task_id`` to ``metadata.task_id`` where that is a string and ``visible_ai`` by
    `runstore.records.is_visible_ai_message` (``metadata.caller`` starting with
    `runstore.events.HIDDEN_CALLER_PREFIX` hides an AI message; `AI_TYPES_SQL` lists the AI types).
    """
    return [
        Migration(1, [_V1_TABLE, _V1_MESSAGES_INDEX, _V1_RUN_INDEX], "events table and indexes"),
        Migration(
            2,
            [_V2_ADD_TASK, _V2_ADD_VISIBLE, *backfill_v2],
            "task_id and visible_ai columns for filters in SQL",
        ),
        Migration(3, [_V3_FENCES], "per-thread fencing tokens of fenced appends"),
    ]
