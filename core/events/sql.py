"""The SQL run event store, dialect-neutral: the contract on any SQLAlchemy engine.

`SqlEventStore` holds the whole contract: validation and record building come from
`runstore.events.records` (shared with every backend), the SQL is written once with ``?``
placeholders, and a `SqlEventDriver` per dialect (the sqlite and postgres plugins
each ship one) runs it on that dialect's driver connections. SQLAlchemy provides
the engine, pool, connection configuration and migrations (`runstore.sql.migrations`);
each operation then runs on a pooled driver connection in one hop, because
SQLAlchemy's aiosqlite adapter costs four worker-thread hops per statement and a
logical write needs four statements. docs/sql-events.md records the measurements
and decisions, and how a third-party SQL backend reuses this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.events.identity import message_identity
from runstore.events.owner import AUTO, UserId
from runstore.events.protocol import (
    AI_MESSAGE_EVENT_TYPES,
    HIDDEN_CALLER_PREFIX,
    MESSAGE_CATEGORY,
    EventRecord,
    Page,
    RunEventStore,
    RunSummary,
    Target,
)
from runstore.events.records import PreparedEvent, normalize_identities, normalize_run_ids
from runstore.events.schema import COMPONENT, FENCES, RECORD_COLUMNS, TABLE
from runstore.fencing import check_fence
from runstore.options import BackendOptions
from runstore.sql.migrations import Migration, ensure_schema
from runstore.standalone import Standalone
from runstore.validation import dumps, loads

S = TypeVar("S", bound="SqlEventStore")

#: Identities per LIKE prefilter statement (keeps statements and bind lists bounded).
IDENTITY_CHUNK = 200

#: One result row, in the column order of the statement.
Row = tuple[Any, ...]
#: The parameters of one statement, in ``?`` order.
Params = Sequence[Any]


def _escape_like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def identity_patterns(identity: str) -> list[str]:
    """LIKE patterns (``\\`` escapes) matching every stored JSON content that may hold ``identity``.

    Content is stored as orjson text, so a key and its string value appear as
    ``"key":"value"`` verbatim. Patterns are a superset: candidates are confirmed with
    `message_identity` after decoding.
    """
    kind, _, value = identity.partition(":")
    if kind == "tool" and value:
        return ["%" + _escape_like('"tool_call_id":' + dumps(value)) + "%"]
    if kind == "message" and value:
        encoded = dumps(value)
        # No closing quote: a human message stored as "<id>__user" shares the identity.
        return ["%" + _escape_like('"id":' + encoded[:-1]) + "%"]
    return []


def record_from_row(row: Row) -> EventRecord:
    """The record of a row selected with `RECORD_COLUMNS`."""
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


def insert_row(event: PreparedEvent, owner: str | None) -> list[Any]:
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
#: The record a `SqlEventDriver.insert_if_absent` key already has (params: the key).
EXISTING_SQL = (
    f"SELECT {RECORD_COLUMNS} FROM {TABLE} "
    "WHERE thread_id = ? AND run_id = ? AND event_type = ? ORDER BY seq LIMIT 1"
)


#: A fenced append's compare-and-set, first in its transaction (params: thread, token): the
#: thread's fence rises to the token unless it is higher; no row returned means stale.
FENCE_SQL = (
    f"INSERT INTO {FENCES} (thread_id, fence) VALUES (?, ?) ON CONFLICT (thread_id) "
    f"DO UPDATE SET fence = excluded.fence WHERE {FENCES}.fence <= excluded.fence RETURNING fence"
)
#: The thread's fence (for the error of a refused append).
FENCE_OF_SQL = f"SELECT fence FROM {FENCES} WHERE thread_id = ?"


# -- the driver interface --------------------------------------------------------------


class SqlEventDriver(ABC):
    """Runs the store's SQL on one dialect's driver connections, one hop per operation.

    Statements arrive with ``?`` placeholders; rows to insert are `insert_row` lists
    in `runstore.sql.schema.INSERT_COLUMNS` order with ``seq`` (index 1) still 0.
    """

    @abstractmethod
    async def start(self) -> None:
        """Acquire what the driver holds for the store's lifetime."""

    @abstractmethod
    async def close(self) -> None:
        """Release it (idempotent)."""

    @abstractmethod
    async def fetch(self, sql: str, params: Params) -> list[Row]:
        """Run one read statement and return its rows."""

    @abstractmethod
    async def insert(self, rows: list[list[Any]], fence: int | None = None) -> list[int]:
        """Insert rows in one transaction serialized per thread; return their seqs in order.

        Each thread's rows get the next seqs after its current maximum, in input order.
        With ``fence``, the transaction first runs `FENCE_SQL` for each thread (sorted)
        and raises `StaleFenceError` (rolling back) when one returns no row.
        """

    @abstractmethod
    async def insert_if_absent(
        self, key: tuple[str, str, str], row: list[Any], fence: int | None = None
    ) -> tuple[Row | None, int]:
        """``(existing_row, 0)`` if ``key`` exists (`EXISTING_SQL`), else insert and return
        ``(None, seq)``; ``fence`` as in `insert`, checked before the key."""

    async def fence(self, thread_id: str, fence: int) -> None:
        """Run `FENCE_SQL` for the thread in a write transaction serialized with its
        appends; raise `StaleFenceError` when it returns no row. A driver whose store
        declares ``fencing`` implements it (`SqlEventStore.fence_thread` calls it)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement fence (no fencing)")

    async def import_rows(self, rows: list[list[Any]]) -> int:
        """Insert `insert_row` rows whose ``seq`` (index 1) is set, skipping any
        ``(thread_id, seq)`` already stored, in one write transaction serialized with the
        threads' appends; return how many were inserted. A driver whose store declares
        ``bulk_import`` implements it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement import_rows (no bulk_import)")

    @abstractmethod
    async def delete(self, thread_id: str, where: str, params: Params) -> int:
        """Delete the matching rows of ``thread_id`` serialized with its writers; return the count."""

    def in_list(self, column: str, values: Sequence[str], params: list[Any]) -> str:
        """A condition ``column IN values`` for a non-empty list, appending its parameters."""
        params.extend(values)
        return f"{column} IN ({', '.join('?' * len(values))})"


# -- the store --------------------------------------------------------------------------


class SqlEventStore(RunEventStore, Standalone):
    """`RunEventStore` on a SQLAlchemy engine whose dialect's `SqlEventDriver` runs the SQL.

    Every method filters by owner (``user_id``); writes serialize per thread as the
    driver arranges (sqlite: the file's write lock; PostgreSQL: a transaction
    advisory lock on the thread). Plugins subclass it with an ``open(url, options)``
    that opens their engine and calls `start`.
    """

    schema_component: ClassVar[str | None] = COMPONENT

    def __init__(
        self, engine: AsyncEngine, driver: SqlEventDriver, *, max_trace_content: int = 10240
    ) -> None:
        self._engine = engine
        self._driver = driver
        self._max_trace = max_trace_content
        self._closed = False

    @classmethod
    async def start(
        cls: type[S],
        engine: AsyncEngine,
        driver: SqlEventDriver,
        options: BackendOptions,
        migrations: Sequence[Migration],
    ) -> S:
        """Bring the schema up to ``migrations``, start ``driver`` and close the store with ``options``."""
        if options.migrate:
            await ensure_schema(engine, COMPONENT, migrations)
        store = cls(engine, driver, max_trace_content=options.settings.run_events.max_trace_content)
        await driver.start()
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
        fence: int | None = None,
    ) -> EventRecord:
        """Append one event and return its record with the assigned ``seq``."""
        event, owner = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip
        (seq,) = await self._insert([insert_row(event, owner)], fence)
        return event.to_record(seq, owner=owner, with_owner=True)

    async def put_batch(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> list[EventRecord]:
        """Append events all-or-nothing in one transaction; one contiguous seq block per thread."""
        call = self._batch_call(events, user_id, max_trace_content=self._max_trace, fence=fence)
        if call is None:
            return []
        prepared, owner = call
        seqs = await self._insert([insert_row(event, owner) for event in prepared], fence)
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
        fence: int | None = None,
    ) -> tuple[EventRecord, bool]:
        """Write unless ``(thread_id, run_id, event_type)`` exists (any owner); return (record, created)."""
        event, owner = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip
        key = (event.thread_id, event.run_id, event.event_type)
        row = insert_row(event, owner)
        if fence is None:  # a driver written before fencing takes no fence argument
            found, seq = await self._driver.insert_if_absent(key, row)
        else:
            found, seq = await self._driver.insert_if_absent(key, row, fence)
        if found is not None:
            return record_from_row(found), False
        return event.to_record(seq, owner=owner, with_owner=True), True

    async def _insert(self, rows: list[list[Any]], fence: int | None) -> list[int]:
        if fence is None:  # a driver written before fencing takes no fence argument
            return await self._driver.insert(rows)
        return await self._driver.insert(rows, fence)

    async def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` (`FENCE_SQL` in a write transaction of its
        own; `StaleFenceError` if the thread has seen a newer token)."""
        thread = self._check_id(thread_id, "thread_id")
        check_fence(fence)
        self._check_open()
        await self._driver.fence(thread, fence)

    # -- reads --------------------------------------------------------------------------

    async def _page(self, clauses: list[str], params: list[Any], page: Page) -> list[EventRecord]:
        """A keyset page: first ``limit`` above ``after_seq``, else last ``limit`` below ``before_seq``."""
        where = _where(
            clauses, params, owner=page.owner, after_seq=page.after_seq, before_seq=page.before_seq
        )
        # Without after_seq the page is the newest rows: walk the index backward, then flip.
        order = "ASC" if page.after_seq is not None else "DESC"
        params.append(page.limit)
        rows = await self._driver.fetch(f"{_SELECT}{where} ORDER BY seq {order} LIMIT ?", params)
        if page.after_seq is None:
            rows.reverse()
        return [record_from_row(r) for r in rows]

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
        page = self._page_call(thread_id, None, limit, before_seq, after_seq, user_id)
        if page is None:
            return []
        return await self._page(["thread_id = ?", "category = 'message'"], [page.thread_id], page)

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
        call = self._run_filter_call(
            thread_id, run_id, event_types, task_id, limit, after_seq, user_id
        )
        if call is None:
            return []
        clauses = ["thread_id = ?", "run_id = ?"]
        params: list[Any] = [call.thread_id, call.run_id]
        if call.event_types is not None:
            clauses.append(self._driver.in_list("event_type", sorted(call.event_types), params))
        if call.task_id is not None:
            clauses.append("task_id = ?")
            params.append(call.task_id)
        where = _where(clauses, params, owner=call.owner, after_seq=call.after_seq)
        params.append(call.limit)
        rows = await self._driver.fetch(f"{_SELECT}{where} ORDER BY seq LIMIT ?", params)
        return [record_from_row(r) for r in rows]

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
        page = self._page_call(thread_id, run_id, limit, before_seq, after_seq, user_id)
        if page is None:
            return []
        return await self._page(
            ["thread_id = ?", "run_id = ?", "category = 'message'"],
            [page.thread_id, page.run_id],
            page,
        )

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """How many ``message`` events the thread holds (the owner's, when filtering)."""
        target = self._target_call(thread_id, None, user_id)
        params: list[Any] = [target.thread_id]
        where = _where(["thread_id = ?", "category = 'message'"], params, owner=target.owner)
        rows = await self._driver.fetch(f"SELECT count(*) FROM {TABLE} WHERE {where}", params)
        return int(rows[0][0])

    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        user_id: UserId = AUTO,
    ) -> dict[str, int]:
        """For each run, the seq of its last visible AI message (one grouped query)."""
        call = self._lookup_call(thread_id, run_ids, normalize_run_ids, user_id)
        if call is None:
            return {}
        clauses = ["thread_id = ?", "category = 'message'", "visible_ai = TRUE"]
        params: list[Any] = [call.thread_id]
        if call.keys is not None:
            clauses.append(self._driver.in_list("run_id", sorted(call.keys), params))
        where = _where(clauses, params, owner=call.owner)
        rows = await self._driver.fetch(
            f"SELECT run_id, max(seq) FROM {TABLE} WHERE {where} GROUP BY run_id", params
        )
        return {run: int(seq) for run, seq in rows}

    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        """Earliest seq per identity; SQL LIKE prefilters candidates, Python confirms them."""
        call = self._lookup_call(thread_id, identities, normalize_identities, user_id)
        if call is None or call.keys is None:
            return {}
        wanted = call.keys
        patterns = sorted({p for identity in wanted for p in identity_patterns(identity)})
        result: dict[str, int] = {}
        for start in range(0, len(patterns), IDENTITY_CHUNK):
            chunk = patterns[start : start + IDENTITY_CHUNK]
            likes = " OR ".join(["content LIKE ? ESCAPE '\\'"] * len(chunk))
            params: list[Any] = [call.thread_id, *chunk]
            where = _where(
                ["thread_id = ?", "category = 'message'", "content_json = TRUE", f"({likes})"],
                params,
                owner=call.owner,
            )
            rows = await self._driver.fetch(
                f"SELECT seq, content FROM {TABLE} WHERE {where} ORDER BY seq", params
            )
            for seq, content in rows:
                identity = message_identity(loads(content))
                if identity in wanted and (identity not in result or seq < result[identity]):
                    result[identity] = int(seq)
        return result

    # -- bulk_import: the feed read whole and written back with its seqs ----------------------

    async def aexport_thread_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """Up to ``limit`` thread ids holding events, ascending, after ``after`` (`BulkEventStore`)."""
        self._check_open()
        params: list[Any] = []
        where = ""
        if after is not None:
            where = "WHERE thread_id > ? "
            params.append(after)
        params.append(limit)
        rows = await self._driver.fetch(
            f"SELECT DISTINCT thread_id FROM {TABLE} {where}ORDER BY thread_id LIMIT ?", params
        )
        return [str(r[0]) for r in rows]

    async def aexport_events(
        self, thread_id: str, *, after_seq: int | None = None, limit: int = 500
    ) -> list[EventRecord]:
        """The thread's first ``limit`` events above ``after_seq``, every owner (`BulkEventStore`)."""
        thread = self._check_id(thread_id, "thread_id")
        self._check_open()
        rows = await self._driver.fetch(
            f"{_SELECT}thread_id = ? AND seq > ? ORDER BY seq ASC LIMIT ?",
            [thread, 0 if after_seq is None else after_seq, limit],
        )
        return [record_from_row(r) for r in rows]

    async def aimport_events(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Insert ``records`` under their own seqs unless already held, one transaction (`BulkEventStore`)."""
        from runstore.events.bulk import prepare_import

        rows = []
        for record in records:
            prepared, seq, owner = prepare_import(record)
            row = insert_row(prepared, owner)
            row[1] = seq
            rows.append(row)
        self._check_open()
        if not rows:
            return 0
        return await self._driver.import_rows(rows)

    # -- deletes --------------------------------------------------------------------------

    async def list_runs(self, thread_id: str, *, user_id: UserId = AUTO) -> list[RunSummary]:
        """The thread's runs with their event and message counts (one grouped query)."""
        target = self._target_call(thread_id, None, user_id)
        params: list[Any] = [target.thread_id]
        where = _where(["thread_id = ?"], params, owner=target.owner)
        rows = await self._driver.fetch(
            "SELECT run_id, count(*), sum(CASE WHEN category = 'message' THEN 1 ELSE 0 END), "
            f"min(seq), max(seq) FROM {TABLE} WHERE {where} GROUP BY run_id ORDER BY min(seq)",
            params,
        )
        return [RunSummary(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]

    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete the thread's events (the owner's, when filtering); return how many."""
        return await self._delete(self._target_call(thread_id, None, user_id))

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete one run's events (the owner's, when filtering); return how many."""
        return await self._delete(self._target_call(thread_id, run_id, user_id))

    async def _delete(self, target: Target) -> int:
        clauses = ["thread_id = ?"]
        params: list[Any] = [target.thread_id]
        if target.run_id is not None:
            clauses.append("run_id = ?")
            params.append(target.run_id)
        where = _where(clauses, params, owner=target.owner)
        return await self._driver.delete(target.thread_id, where, params)


__all__ = [
    "EXISTING_SQL",
    "FENCE_OF_SQL",
    "FENCE_SQL",
    "SqlEventDriver",
    "SqlEventStore",
    "identity_patterns",
    "insert_row",
    "record_from_row",
]
