"""The SQL run event store: one SQLAlchemy-async implementation for sqlite and PostgreSQL.

`SqlEventStore` holds everything; the dialect differences (write serialization,
DDL) live in two small strategy classes. Input validation, record building and
trace truncation come from `runstore.records`, shared with every other backend.
docs/sql-events.md describes the schema, indexes, locking and the decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select

from ..events import (
    AI_MESSAGE_EVENT_TYPES,
    HIDDEN_CALLER_PREFIX,
    MESSAGE_CATEGORY,
    EventRecord,
    RunEventStore,
)
from ..identity import message_identity
from ..options import BackendOptions
from ..owner import AUTO, UserId, resolve_owner
from ..records import (
    PreparedEvent,
    check_cursor,
    check_event_types,
    check_limit,
    check_task_id,
    dumps,
    loads,
    normalize_identities,
    normalize_run_ids,
    prepare_batch,
    prepare_event,
    validate_id,
)
from ..urls import BackendURL
from .engine import dialect_of, shared_engine, write_connection
from .migrations import Migration, ensure_schema

TABLE = "runstore_events"
COMPONENT = "events"
#: Identities per LIKE prefilter statement (keeps statements and bind lists bounded).
IDENTITY_CHUNK = 200
#: First key of the two-int advisory lock on a thread (the second is hashtext(thread_id)),
#: so our locks never collide with other users of single-bigint advisory locks.
PG_LOCK_NAMESPACE = 0x52534556  # "RSEV"
#: URL options of a PostgreSQL store (``schema``: the search_path, created if missing).
PG_URL_OPTIONS = frozenset({"schema"})

metadata_obj = MetaData()
events_table = Table(
    TABLE,
    metadata_obj,
    Column("thread_id", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("run_id", Text, nullable=False),
    Column("event_type", String(32), nullable=False),
    Column("category", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("content_json", Boolean, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("user_id", Text, nullable=True),
    Column("task_id", Text, nullable=True),
    Column("visible_ai", Boolean, nullable=False),
)
t = events_table.c

# -- schema -------------------------------------------------------------------------

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

# -- statements (built once; SQLAlchemy caches their compiled form) -------------------

_COLUMNS = (
    t.thread_id, t.seq, t.run_id, t.event_type, t.category, t.content,
    t.content_json, t.metadata, t.created_at, t.user_id,
)  # fmt: skip

_INSERT = insert(events_table)
_MAX_SEQ = select(func.coalesce(func.max(t.seq), 0)).where(t.thread_id == bindparam("thread_id"))
_MAX_SEQS = (
    select(t.thread_id, func.max(t.seq))
    .where(t.thread_id.in_(bindparam("thread_ids", expanding=True)))
    .group_by(t.thread_id)
)
_EXISTING = (
    select(*_COLUMNS)
    .where(
        t.thread_id == bindparam("thread_id"),
        t.run_id == bindparam("run_id"),
        t.event_type == bindparam("event_type"),
    )
    .order_by(t.seq)
    .limit(1)
)
_IS_MESSAGE = t.category == MESSAGE_CATEGORY


def _escape_like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def identity_patterns(identity: str) -> list[str]:
    """LIKE patterns (``\\`` escapes) matching every stored JSON content that may hold ``identity``.

    Content is stored as orjson text, so a key and its string value appear as
    ``"key":"value"`` verbatim. Patterns are a superset: candidates are confirmed with
    `runstore.message_identity` after decoding.
    """
    kind, _, value = identity.partition(":")
    if kind == "tool" and value:
        return ["%" + _escape_like('"tool_call_id":' + dumps(value)) + "%"]
    if kind == "message" and value:
        encoded = dumps(value)
        # No closing quote: a human message stored as "<id>__user" shares the identity.
        return ["%" + _escape_like('"id":' + encoded[:-1]) + "%"]
    return []


class _Dialect:
    """What differs between the SQL dialects."""

    name: ClassVar[str]
    migrations: ClassVar[Sequence[Migration]]

    async def lock_threads(self, conn: AsyncConnection, thread_ids: Sequence[str]) -> None:
        """Serialize this transaction with every other writer of ``thread_ids``."""


class _SqliteDialect(_Dialect):
    name = "sqlite"
    migrations = SQLITE_MIGRATIONS

    # BEGIN IMMEDIATE (see engine.write_connection) already holds the file's only write
    # lock, which serializes every writer of every thread across processes.


class _PostgresDialect(_Dialect):
    name = "postgresql"
    migrations = POSTGRES_MIGRATIONS
    _lock = text(f"SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, hashtext(:thread_id))")

    async def lock_threads(self, conn: AsyncConnection, thread_ids: Sequence[str]) -> None:
        # Sorted order: two batches touching the same threads cannot deadlock.
        for thread_id in sorted(set(thread_ids)):
            await conn.execute(self._lock, {"thread_id": thread_id})


class SqlEventStore(RunEventStore):
    """`RunEventStore` on a SQLAlchemy async engine (sqlite via aiosqlite, PostgreSQL via asyncpg).

    Every method filters by owner (``user_id``); writes serialize per thread (sqlite:
    the file's write lock; PostgreSQL: a transaction advisory lock on the thread).
    """

    #: Extra URL query options a subclass accepts (PostgreSQL always accepts ``schema``).
    url_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, engine: AsyncEngine, *, max_trace_content: int = 10240) -> None:
        self._engine = engine
        self._max_trace = max_trace_content
        self._dialect: _Dialect = (
            _PostgresDialect() if engine.dialect.name == "postgresql" else _SqliteDialect()
        )
        self._closed = False

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqlEventStore:
        """Open (creating or upgrading the schema) on the engine shared for ``url``."""
        url = BackendURL.parse(url)
        dialect = dialect_of(url)
        url.check_options(cls.url_options | (PG_URL_OPTIONS if dialect == "postgresql" else set()))
        engine = await shared_engine(url, options)
        migrations = POSTGRES_MIGRATIONS if dialect == "postgresql" else SQLITE_MIGRATIONS
        await ensure_schema(engine, COMPONENT, migrations)
        store = cls(engine, max_trace_content=options.settings.run_events.max_trace_content)
        options.on_close(store.close)
        return store

    @property
    def engine(self) -> AsyncEngine:
        """The (shared) engine the store runs on."""
        return self._engine

    async def close(self) -> None:
        """Mark the store closed; the shared engine is disposed by its `BackendOptions`."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this event store is closed")

    # -- writes -------------------------------------------------------------------------

    def _row(self, event: PreparedEvent, seq: int, owner: str | None) -> dict[str, Any]:
        meta = event.metadata
        task = meta.get("task_id")
        caller = meta.get("caller")
        return {
            "thread_id": event.thread_id,
            "seq": seq,
            "run_id": event.run_id,
            "event_type": event.event_type,
            "category": event.category,
            "content": event.content_text(),
            "content_json": event.content_is_json,
            "metadata": dumps(meta),
            "created_at": event.created_at,
            "user_id": owner,
            "task_id": task if isinstance(task, str) else None,
            "visible_ai": event.category == MESSAGE_CATEGORY
            and event.event_type in AI_MESSAGE_EVENT_TYPES
            and not (isinstance(caller, str) and caller.startswith(HIDDEN_CALLER_PREFIX)),
        }

    async def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: Any = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> EventRecord:
        """Append one event and return its record with the assigned ``seq``."""
        self._check_open()
        event = prepare_event(
            thread_id=thread_id,
            run_id=run_id,
            event_type=event_type,
            category=category,
            content=content,
            metadata=metadata,
            created_at=created_at,
            max_trace_content=self._max_trace,
        )
        owner = resolve_owner(user_id)
        async with write_connection(self._engine) as conn:
            await self._dialect.lock_threads(conn, (event.thread_id,))
            seq = int((await conn.execute(_MAX_SEQ, {"thread_id": event.thread_id})).scalar_one())
            seq += 1
            await conn.execute(_INSERT, [self._row(event, seq, owner)])
        return event.to_record(seq, owner=owner, with_owner=True)

    async def put_batch(
        self, events: Sequence[Mapping[str, Any]], *, user_id: UserId = AUTO
    ) -> list[EventRecord]:
        """Append events all-or-nothing in one transaction; one contiguous seq block per thread."""
        self._check_open()
        prepared = prepare_batch(events, max_trace_content=self._max_trace)
        owner = resolve_owner(user_id)
        if not prepared:
            return []
        threads = list(dict.fromkeys(e.thread_id for e in prepared))
        async with write_connection(self._engine) as conn:
            await self._dialect.lock_threads(conn, threads)
            if len(threads) == 1:
                top = int((await conn.execute(_MAX_SEQ, {"thread_id": threads[0]})).scalar_one())
                last = {threads[0]: top}
            else:
                last = dict.fromkeys(threads, 0)
                for tid, top in await conn.execute(_MAX_SEQS, {"thread_ids": threads}):
                    last[tid] = int(top)
            rows: list[dict[str, Any]] = []
            seqs: list[int] = []
            for event in prepared:
                seq = last[event.thread_id] + 1
                last[event.thread_id] = seq
                seqs.append(seq)
                rows.append(self._row(event, seq, owner))
            # One executemany; any failure rolls the whole transaction back.
            await conn.execute(_INSERT, rows)
        return [
            event.to_record(seq, owner=owner, with_owner=True)
            for event, seq in zip(prepared, seqs, strict=True)
        ]

    async def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: Any = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> tuple[EventRecord, bool]:
        """Write unless ``(thread_id, run_id, event_type)`` exists (any owner); return (record, created)."""
        self._check_open()
        event = prepare_event(
            thread_id=thread_id,
            run_id=run_id,
            event_type=event_type,
            category=category,
            content=content,
            metadata=metadata,
            created_at=created_at,
            max_trace_content=self._max_trace,
        )
        owner = resolve_owner(user_id)
        async with write_connection(self._engine) as conn:
            await self._dialect.lock_threads(conn, (event.thread_id,))
            found = (
                await conn.execute(
                    _EXISTING,
                    {
                        "thread_id": event.thread_id,
                        "run_id": event.run_id,
                        "event_type": event.event_type,
                    },
                )
            ).first()
            if found is not None:
                return _record(found), False
            seq = int((await conn.execute(_MAX_SEQ, {"thread_id": event.thread_id})).scalar_one())
            seq += 1
            await conn.execute(_INSERT, [self._row(event, seq, owner)])
        return event.to_record(seq, owner=owner, with_owner=True), True

    # -- reads --------------------------------------------------------------------------

    async def _fetch(self, stmt: Any, params: Mapping[str, Any] | None = None) -> list[Any]:
        self._check_open()
        async with self._engine.connect() as conn:
            result = await conn.execute(stmt, dict(params or {}))
            return list(result.all())

    def _page(
        self,
        where: list[Any],
        *,
        limit: int,
        before_seq: int | None,
        after_seq: int | None,
    ) -> Select[Any]:
        """A keyset page: first ``limit`` above ``after_seq`` or last ``limit`` below ``before_seq``."""
        if after_seq is not None:
            where.append(t.seq > after_seq)
        if before_seq is not None:
            where.append(t.seq < before_seq)
        stmt = select(*_COLUMNS).where(and_(*where))
        if after_seq is not None:
            return stmt.order_by(t.seq).limit(limit)
        # Newest-first on the index, then flipped to ascending in Python.
        return stmt.order_by(t.seq.desc()).limit(limit)

    async def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """A page of ``message`` events, ascending, with exclusive keyset cursors."""
        validate_id(thread_id, "thread_id")
        limit = check_limit(limit)
        before_seq = check_cursor(before_seq, "before_seq")
        after_seq = check_cursor(after_seq, "after_seq")
        owner = resolve_owner(user_id)
        if limit == 0:
            return []
        where = [t.thread_id == thread_id, _IS_MESSAGE]
        if owner is not None:
            where.append(t.user_id == owner)
        stmt = self._page(where, limit=limit, before_seq=before_seq, after_seq=after_seq)
        rows = await self._fetch(stmt)
        if after_seq is None:
            rows.reverse()
        return [_record(r) for r in rows]

    async def list_events(
        self,
        thread_id: str,
        run_id: str,
        *,
        event_types: Sequence[str] | None = None,
        task_id: str | None = None,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """The first ``limit`` events of a run above ``after_seq``, filtered in SQL."""
        validate_id(thread_id, "thread_id")
        validate_id(run_id, "run_id")
        types = check_event_types(event_types)
        task_id = check_task_id(task_id)
        limit = check_limit(limit)
        after_seq = check_cursor(after_seq, "after_seq")
        owner = resolve_owner(user_id)
        if limit == 0 or (types is not None and not types):
            return []
        where = [t.thread_id == thread_id, t.run_id == run_id]
        if after_seq is not None:
            where.append(t.seq > after_seq)
        if types is not None:
            where.append(t.event_type.in_(sorted(types)))
        if task_id is not None:
            where.append(t.task_id == task_id)
        if owner is not None:
            where.append(t.user_id == owner)
        stmt = select(*_COLUMNS).where(and_(*where)).order_by(t.seq).limit(limit)
        return [_record(r) for r in await self._fetch(stmt)]

    async def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 500,
        after_seq: int | None = None,
        before_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """A page of one run's ``message`` events, paged like `list_messages`."""
        validate_id(thread_id, "thread_id")
        validate_id(run_id, "run_id")
        limit = check_limit(limit)
        before_seq = check_cursor(before_seq, "before_seq")
        after_seq = check_cursor(after_seq, "after_seq")
        owner = resolve_owner(user_id)
        if limit == 0:
            return []
        where = [t.thread_id == thread_id, t.run_id == run_id, _IS_MESSAGE]
        if owner is not None:
            where.append(t.user_id == owner)
        stmt = self._page(where, limit=limit, before_seq=before_seq, after_seq=after_seq)
        rows = await self._fetch(stmt)
        if after_seq is None:
            rows.reverse()
        return [_record(r) for r in rows]

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """How many ``message`` events the thread holds (the owner's, when filtering)."""
        validate_id(thread_id, "thread_id")
        owner = resolve_owner(user_id)
        where = [t.thread_id == thread_id, _IS_MESSAGE]
        if owner is not None:
            where.append(t.user_id == owner)
        rows = await self._fetch(select(func.count()).select_from(events_table).where(*where))
        return int(rows[0][0])

    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        user_id: UserId = AUTO,
    ) -> dict[str, int]:
        """For each run, the seq of its last visible AI message (one grouped query)."""
        validate_id(thread_id, "thread_id")
        runs = normalize_run_ids(run_ids)
        owner = resolve_owner(user_id)
        if runs is not None and not runs:
            return {}
        where = [t.thread_id == thread_id, _IS_MESSAGE, t.visible_ai == True]  # noqa: E712
        if runs is not None:
            where.append(t.run_id.in_(sorted(runs)))
        if owner is not None:
            where.append(t.user_id == owner)
        stmt = select(t.run_id, func.max(t.seq)).where(*where).group_by(t.run_id)
        return {run: int(seq) for run, seq in await self._fetch(stmt)}

    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        """Earliest seq per identity; SQL LIKE prefilters candidates, Python confirms them."""
        validate_id(thread_id, "thread_id")
        wanted = normalize_identities(identities)
        owner = resolve_owner(user_id)
        if not wanted:
            return {}
        patterns = sorted({p for identity in wanted for p in identity_patterns(identity)})
        if not patterns:
            return {}
        result: dict[str, int] = {}
        self._check_open()
        async with self._engine.connect() as conn:
            for start in range(0, len(patterns), IDENTITY_CHUNK):
                chunk = patterns[start : start + IDENTITY_CHUNK]
                where = [
                    t.thread_id == thread_id,
                    _IS_MESSAGE,
                    t.content_json == True,  # noqa: E712
                    or_(*(t.content.like(p, escape="\\") for p in chunk)),
                ]
                if owner is not None:
                    where.append(t.user_id == owner)
                stmt = select(t.seq, t.content).where(*where).order_by(t.seq)
                for seq, content in await conn.execute(stmt):
                    identity = message_identity(loads(content))
                    if identity in wanted and (identity not in result or seq < result[identity]):
                        result[identity] = int(seq)
        return result

    # -- deletes --------------------------------------------------------------------------

    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete the thread's events (the owner's, when filtering); return how many."""
        validate_id(thread_id, "thread_id")
        return await self._delete([t.thread_id == thread_id], thread_id, resolve_owner(user_id))

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete one run's events (the owner's, when filtering); return how many."""
        validate_id(thread_id, "thread_id")
        validate_id(run_id, "run_id")
        where = [t.thread_id == thread_id, t.run_id == run_id]
        return await self._delete(where, thread_id, resolve_owner(user_id))

    async def _delete(self, where: list[Any], thread_id: str, owner: str | None) -> int:
        self._check_open()
        if owner is not None:
            where.append(t.user_id == owner)
        async with write_connection(self._engine) as conn:
            await self._dialect.lock_threads(conn, (thread_id,))
            result = await conn.execute(delete(events_table).where(*where))
            return int(result.rowcount)


def _record(row: Any) -> EventRecord:
    (thread_id, seq, run_id, event_type, category, content, is_json, meta, created, owner) = row
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": event_type,
        "category": category,
        "content": loads(content) if is_json else content,
        "metadata": loads(meta),
        "seq": int(seq),
        "created_at": created,
        "user_id": owner,
    }


__all__ = [
    "POSTGRES_MIGRATIONS",
    "SQLITE_MIGRATIONS",
    "SqlEventStore",
    "events_table",
    "identity_patterns",
]
