"""The SQL run event store: one implementation for sqlite and PostgreSQL.

`SqlEventStore` holds the whole contract: validation and record building come from
`runstore.records` (shared with every backend), the SQL is written once with ``?``
placeholders, and a small per-dialect driver runs it. SQLAlchemy provides the engine,
pool, connection configuration and migrations (`runstore.sql.engine`,
`runstore.sql.migrations`); each operation then runs on the pooled driver connection
in one hop, because SQLAlchemy's aiosqlite adapter costs four worker-thread hops per
statement and a logical write needs four statements (DESIGN §7: one hop per logical
operation). docs/sql-events.md records the measurements and decisions.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

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
    check_page,
    check_run_filter,
    dumps,
    loads,
    normalize_identities,
    normalize_run_ids,
    prepare_batch,
    prepare_event,
    validate_id,
)
from ..urls import BackendURL
from .engine import dialect_of, shared_engine, sqlite_write_lock
from .migrations import ensure_schema
from .schema import (
    COMPONENT,
    INSERT_COLUMNS,
    POSTGRES_MIGRATIONS,
    RECORD_COLUMNS,
    SQLITE_MIGRATIONS,
    TABLE,
)

R = TypeVar("R")

#: Identities per LIKE prefilter statement (keeps statements and bind lists bounded).
IDENTITY_CHUNK = 200
#: First key of the two-int advisory lock on a thread (the second is hashtext(thread_id)),
#: so our locks never collide with single-bigint advisory locks of other software.
PG_LOCK_NAMESPACE = 0x52534556  # "RSEV"
#: URL options of a PostgreSQL store (``schema``: the search_path, created if missing).
PG_URL_OPTIONS = frozenset({"schema"})

Row = tuple[Any, ...]
Params = Sequence[Any]


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


def _record(row: Row) -> EventRecord:
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


def _row(event: PreparedEvent, owner: str | None) -> list[Any]:
    """The insert row of ``event`` in `INSERT_COLUMNS` order, ``seq`` (index 1) still 0."""
    meta = event.metadata
    task = meta.get("task_id")
    caller = meta.get("caller")
    visible = (
        event.category == MESSAGE_CATEGORY
        and event.event_type in AI_MESSAGE_EVENT_TYPES
        and not (isinstance(caller, str) and caller.startswith(HIDDEN_CALLER_PREFIX))
    )
    return [
        event.thread_id, 0, event.run_id, event.event_type, event.category,
        event.content_text(), event.content_is_json, dumps(meta), event.created_at, owner,
        task if isinstance(task, str) else None, visible,
    ]  # fmt: skip


def _where(
    clauses: list[str],
    params: list[Any],
    *,
    owner: str | None,
    after_seq: int | None = None,
    before_seq: int | None = None,
) -> str:
    if owner is not None:
        clauses.append("user_id = ?")
        params.append(owner)
    if after_seq is not None:
        clauses.append("seq > ?")
        params.append(after_seq)
    if before_seq is not None:
        clauses.append("seq < ?")
        params.append(before_seq)
    return " AND ".join(clauses)


_SELECT = f"SELECT {RECORD_COLUMNS} FROM {TABLE} WHERE "
_MAX_SEQ = f"SELECT coalesce(max(seq), 0) FROM {TABLE} WHERE thread_id = ?"
_EXISTING = (
    f"SELECT {RECORD_COLUMNS} FROM {TABLE} "
    "WHERE thread_id = ? AND run_id = ? AND event_type = ? ORDER BY seq LIMIT 1"
)


# -- drivers --------------------------------------------------------------------------


class _Driver(ABC):
    """Runs the store's SQL on one dialect's driver connections, one hop per operation."""

    @abstractmethod
    async def start(self) -> None:
        """Acquire what the driver holds for the store's lifetime."""

    @abstractmethod
    async def close(self) -> None:
        """Release it (idempotent)."""

    @abstractmethod
    async def fetch(self, sql: str, params: Params) -> list[Row]:
        """Run one read statement (``?`` placeholders) and return its rows."""

    @abstractmethod
    async def insert(self, rows: list[list[Any]]) -> list[int]:
        """Insert rows under the threads' write serialization; return their seqs in order."""

    @abstractmethod
    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any]
    ) -> tuple[Row | None, int]:
        """``(existing_row, 0)`` if ``key`` exists, else insert and return ``(None, seq)``."""

    @abstractmethod
    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        """Delete the matching rows of ``thread_id`` serialized with its writers; return the count."""


def _assign_seqs(rows: list[list[Any]], last: dict[str, int]) -> list[int]:
    seqs = []
    for row in rows:
        seq = last[row[0]] + 1
        last[row[0]] = seq
        row[1] = seq
        seqs.append(seq)
    return seqs


class _SqliteDriver(_Driver):
    """Two pooled aiosqlite connections held for the store's life: a writer and a reader.

    Each operation is one function call in the connection's worker thread on the
    stdlib sqlite3 connection (aiosqlite's queue). Writers open ``BEGIN IMMEDIATE``
    (the file's write lock, waiting up to busy_timeout, serializing every writer of
    every process) after queueing on the engine's in-process write lock, shared with
    the sqlite saver. The reader never waits for a writer (WAL).
    """

    _INSERT = f"INSERT INTO {TABLE} ({', '.join(INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(INSERT_COLUMNS))})"

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._lock = sqlite_write_lock(engine)
        self._held: list[AsyncConnection] = []
        self._writer: Any = None
        self._reader: Any = None

    async def start(self) -> None:
        self._writer = await self._hold()
        self._reader = await self._hold()

    async def _hold(self) -> Any:
        conn = await self._engine.connect()
        self._held.append(conn)
        aconn = (await conn.get_raw_connection()).driver_connection
        if not callable(getattr(aconn, "_execute", None)):
            raise RuntimeError("unsupported aiosqlite version: Connection._execute is missing")
        return aconn

    async def close(self) -> None:
        held, self._held = self._held, []
        self._writer = self._reader = None
        for conn in held:
            await conn.close()

    async def _call(self, aconn: Any, fn: Callable[..., R], *args: Any) -> R:
        if aconn is None:
            raise RuntimeError("this event store is closed")
        result: R = await aconn._execute(fn, aconn._conn, *args)
        return result

    async def _write(self, fn: Callable[..., R], *args: Any) -> R:
        if self._lock is None:
            return await self._call(self._writer, _transaction, fn, *args)
        async with self._lock:
            return await self._call(self._writer, _transaction, fn, *args)

    async def fetch(self, sql: str, params: Params) -> list[Row]:
        return await self._call(self._reader, _fetchall, sql, params)

    async def insert(self, rows: list[list[Any]]) -> list[int]:
        def work(conn: sqlite3.Connection) -> list[int]:
            last = {
                tid: conn.execute(_MAX_SEQ, (tid,)).fetchone()[0] for tid in {r[0] for r in rows}
            }
            seqs = _assign_seqs(rows, last)
            conn.executemany(self._INSERT, rows)
            return seqs

        return await self._write(work)

    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any]
    ) -> tuple[Row | None, int]:
        def work(conn: sqlite3.Connection) -> tuple[Row | None, int]:
            found = conn.execute(_EXISTING, key).fetchone()
            if found is not None:
                return tuple(found), 0
            row[1] = conn.execute(_MAX_SEQ, (row[0],)).fetchone()[0] + 1
            conn.execute(self._INSERT, row)
            return None, row[1]

        return await self._write(work)

    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        sql = f"DELETE FROM {TABLE} WHERE {where}"
        return await self._write(lambda conn: conn.execute(sql, params).rowcount)


def _fetchall(conn: sqlite3.Connection, sql: str, params: Params) -> list[Row]:
    return conn.execute(sql, params).fetchall()


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], R]) -> R:
    """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction: committed if it returns, else rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _dollar(sql: str) -> str:
    """Rewrite ``?`` placeholders as asyncpg's ``$n`` (our SQL has no ``?`` in literals)."""
    parts = sql.split("?")
    out = [parts[0]]
    for index, part in enumerate(parts[1:], start=1):
        out.append(f"${index}{part}")
    return "".join(out)


class _PostgresDriver(_Driver):
    """asyncpg connections from the shared pool, one per operation.

    Writes lock their threads with ``pg_advisory_xact_lock(namespace, hashtext(thread))``
    (released at commit) and insert a whole batch with one ``unnest`` statement that
    also allocates the seqs, so a write is BEGIN, lock, insert, COMMIT.
    """

    # Locks are taken in key order, so two batches sharing threads (even threads whose
    # hashes collide) always lock in the same order and cannot deadlock.
    _LOCK = (
        f"SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, k) FROM "
        "(SELECT DISTINCT hashtext(t) AS k FROM unnest($1::text[]) AS t ORDER BY k) AS keys"
    )
    _INSERT = (
        f"INSERT INTO {TABLE} ({', '.join(INSERT_COLUMNS)}) "
        "SELECT u.thread_id, "
        f"coalesce((SELECT max(e.seq) FROM {TABLE} e WHERE e.thread_id = u.thread_id), 0) "
        "+ row_number() OVER (PARTITION BY u.thread_id ORDER BY u.ord), "
        "u.run_id, u.event_type, u.category, u.content, u.content_json, u.metadata, "
        "u.created_at, $9, u.task_id, u.visible_ai "
        "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], "
        "$7::text[], $8::text[], $10::text[], $11::bool[]) WITH ORDINALITY "
        "AS u(thread_id, run_id, event_type, category, content, content_json, metadata, "
        "created_at, task_id, visible_ai, ord) "
        "RETURNING thread_id, seq"
    )

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._closed = False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._closed = True

    async def _run(self, fn: Callable[[Any], Any]) -> Any:
        if self._closed:
            raise RuntimeError("this event store is closed")
        async with self._engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            return await fn(raw)

    async def fetch(self, sql: str, params: Params) -> list[Row]:
        sql = _dollar(sql)
        return [tuple(r) for r in await self._run(lambda raw: raw.fetch(sql, *params))]

    async def insert(self, rows: list[list[Any]]) -> list[int]:
        columns = list(zip(*rows, strict=True))
        owner = rows[0][9]
        threads = list({r[0] for r in rows})

        async def work(raw: Any) -> list[Any]:
            async with raw.transaction():
                await raw.execute(self._LOCK, threads)
                return list(
                    await raw.fetch(
                        self._INSERT,
                        columns[0],
                        columns[2],
                        columns[3],
                        columns[4],
                        columns[5],
                        columns[6],
                        columns[7],
                        columns[8],
                        owner,
                        columns[10],
                        columns[11],
                    )
                )

        returned = await self._run(work)
        # The statement numbers each thread's rows in input order; hand them back so.
        by_thread: dict[str, list[int]] = {}
        for thread_id, seq in returned:
            by_thread.setdefault(thread_id, []).append(int(seq))
        for seqs in by_thread.values():
            seqs.sort(reverse=True)
        out = []
        for row in rows:
            row[1] = by_thread[row[0]].pop()
            out.append(row[1])
        return out

    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any]
    ) -> tuple[Row | None, int]:
        existing = _dollar(_EXISTING)

        async def work(raw: Any) -> tuple[Row | None, int]:
            async with raw.transaction():
                await raw.execute(self._LOCK, [row[0]])
                found = await raw.fetchrow(existing, *key)
                if found is not None:
                    return tuple(found), 0
                inserted = await raw.fetchrow(
                    self._INSERT,
                    [row[0]], [row[2]], [row[3]], [row[4]], [row[5]], [row[6]], [row[7]],
                    [row[8]], row[9], [row[10]], [row[11]],
                )  # fmt: skip
                return None, int(inserted[1])

        result: tuple[Row | None, int] = await self._run(work)
        return result

    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        sql = _dollar(f"DELETE FROM {TABLE} WHERE {where}")

        async def work(raw: Any) -> int:
            async with raw.transaction():
                await raw.execute(self._LOCK, [thread_id])
                status = await raw.execute(sql, *params)
            return int(status.rsplit(" ", 1)[-1])

        count: int = await self._run(work)
        return count


# -- the store --------------------------------------------------------------------------


class SqlEventStore(RunEventStore):
    """`RunEventStore` on a shared SQLAlchemy engine (sqlite via aiosqlite, PostgreSQL via asyncpg).

    Every method filters by owner (``user_id``); writes serialize per thread (sqlite:
    the file's write lock; PostgreSQL: a transaction advisory lock on the thread).
    """

    #: Extra URL query options a subclass accepts (PostgreSQL always accepts ``schema``).
    url_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, engine: AsyncEngine, *, max_trace_content: int = 10240) -> None:
        self._engine = engine
        self._max_trace = max_trace_content
        self._postgres = engine.dialect.name == "postgresql"
        self._driver: _Driver = _PostgresDriver(engine) if self._postgres else _SqliteDriver(engine)
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
        await store._driver.start()
        options.on_close(store.close)
        return store

    @property
    def engine(self) -> AsyncEngine:
        """The (shared) engine the store runs on."""
        return self._engine

    async def close(self) -> None:
        """Release the store's connections; the shared engine is disposed by its options."""
        self._closed = True
        await self._driver.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this event store is closed")

    def _in(self, column: str, values: Sequence[str], params: list[Any]) -> str:
        """``column IN (...)`` for a non-empty list (one array parameter on PostgreSQL)."""
        if self._postgres:
            params.append(list(values))
            return f"{column} = ANY(?::text[])"
        params.extend(values)
        return f"{column} IN ({', '.join('?' * len(values))})"

    # -- writes -------------------------------------------------------------------------

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
        (seq,) = await self._driver.insert([_row(event, owner)])
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
        seqs = await self._driver.insert([_row(event, owner) for event in prepared])
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
        found, seq = await self._driver.insert_if_absent(
            (event.thread_id, event.run_id, event.event_type), _row(event, owner)
        )
        if found is not None:
            return _record(found), False
        return event.to_record(seq, owner=owner, with_owner=True), True

    # -- reads --------------------------------------------------------------------------

    async def _page(
        self,
        clauses: list[str],
        params: list[Any],
        *,
        owner: str | None,
        limit: int,
        before_seq: int | None,
        after_seq: int | None,
    ) -> list[EventRecord]:
        """A keyset page: first ``limit`` above ``after_seq``, else last ``limit`` below ``before_seq``."""
        where = _where(clauses, params, owner=owner, after_seq=after_seq, before_seq=before_seq)
        # Without after_seq the page is the newest rows: walk the index backward, then flip.
        order = "ASC" if after_seq is not None else "DESC"
        params.append(limit)
        rows = await self._fetch(f"{_SELECT}{where} ORDER BY seq {order} LIMIT ?", params)
        if after_seq is None:
            rows.reverse()
        return [_record(r) for r in rows]

    async def _fetch(self, sql: str, params: Params) -> list[Row]:
        self._check_open()
        return await self._driver.fetch(sql, params)

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
        limit, before_seq, after_seq = check_page(limit, before_seq, after_seq)
        owner = resolve_owner(user_id)
        if limit == 0:
            return []
        return await self._page(
            ["thread_id = ?", "category = 'message'"],
            [thread_id],
            owner=owner,
            limit=limit,
            before_seq=before_seq,
            after_seq=after_seq,
        )

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
        types, task_id, limit, after_seq = check_run_filter(event_types, task_id, limit, after_seq)
        owner = resolve_owner(user_id)
        if limit == 0 or (types is not None and not types):
            return []
        clauses = ["thread_id = ?", "run_id = ?"]
        params: list[Any] = [thread_id, run_id]
        if types is not None:
            clauses.append(self._in("event_type", sorted(types), params))
        if task_id is not None:
            clauses.append("task_id = ?")
            params.append(task_id)
        where = _where(clauses, params, owner=owner, after_seq=after_seq)
        params.append(limit)
        rows = await self._fetch(f"{_SELECT}{where} ORDER BY seq LIMIT ?", params)
        return [_record(r) for r in rows]

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
        limit, before_seq, after_seq = check_page(limit, before_seq, after_seq)
        owner = resolve_owner(user_id)
        if limit == 0:
            return []
        return await self._page(
            ["thread_id = ?", "run_id = ?", "category = 'message'"],
            [thread_id, run_id],
            owner=owner,
            limit=limit,
            before_seq=before_seq,
            after_seq=after_seq,
        )

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """How many ``message`` events the thread holds (the owner's, when filtering)."""
        validate_id(thread_id, "thread_id")
        owner = resolve_owner(user_id)
        params: list[Any] = [thread_id]
        where = _where(["thread_id = ?", "category = 'message'"], params, owner=owner)
        rows = await self._fetch(f"SELECT count(*) FROM {TABLE} WHERE {where}", params)
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
        clauses = ["thread_id = ?", "category = 'message'", "visible_ai = TRUE"]
        params: list[Any] = [thread_id]
        if runs is not None:
            clauses.append(self._in("run_id", sorted(runs), params))
        where = _where(clauses, params, owner=owner)
        rows = await self._fetch(
            f"SELECT run_id, max(seq) FROM {TABLE} WHERE {where} GROUP BY run_id", params
        )
        return {run: int(seq) for run, seq in rows}

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
        result: dict[str, int] = {}
        for start in range(0, len(patterns), IDENTITY_CHUNK):
            chunk = patterns[start : start + IDENTITY_CHUNK]
            likes = " OR ".join(["content LIKE ? ESCAPE '\\'"] * len(chunk))
            params: list[Any] = [thread_id, *chunk]
            where = _where(
                ["thread_id = ?", "category = 'message'", "content_json = TRUE", f"({likes})"],
                params,
                owner=owner,
            )
            rows = await self._fetch(
                f"SELECT seq, content FROM {TABLE} WHERE {where} ORDER BY seq", params
            )
            for seq, content in rows:
                identity = message_identity(loads(content))
                if identity in wanted and (identity not in result or seq < result[identity]):
                    result[identity] = int(seq)
        return result

    # -- deletes --------------------------------------------------------------------------

    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete the thread's events (the owner's, when filtering); return how many."""
        validate_id(thread_id, "thread_id")
        owner = resolve_owner(user_id)
        params: list[Any] = [thread_id]
        where = _where(["thread_id = ?"], params, owner=owner)
        self._check_open()
        return await self._driver.delete(thread_id, where, params)

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete one run's events (the owner's, when filtering); return how many."""
        validate_id(thread_id, "thread_id")
        validate_id(run_id, "run_id")
        owner = resolve_owner(user_id)
        params: list[Any] = [thread_id, run_id]
        where = _where(["thread_id = ?", "run_id = ?"], params, owner=owner)
        self._check_open()
        return await self._driver.delete(thread_id, where, params)


__all__ = ["PG_LOCK_NAMESPACE", "SqlEventStore", "identity_patterns"]
