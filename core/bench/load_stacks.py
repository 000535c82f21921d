"""The storage stacks `runstore bench load` drives: runstore's and the stock peers.

A stack is a checkpoint saver, an event journal and a live stream, opened once per
worker process. runstore's stacks open through `runstore.open` exactly as a runtime
does; the stock stacks are what a team would write with the stock savers and raw
drivers:

- ``embedded``: runstore's default, one sqlite file for checkpoints and events, the
  in-process memory bridge.
- ``pg+redis``: runstore's PostgreSQL saver and event store (one shared pool of
  ``postgres.pool_max_size``) and its Redis stream bridge.
- ``stock``: LangGraph's `AsyncPostgresSaver` on a psycopg `AsyncConnectionPool` of the
  same size; events as ``executemany`` INSERTs in one transaction on that pool into a
  plain table; streams as raw redis-py ``XADD`` and a blocking ``XREAD`` per subscriber.
- ``stock-sqlite``: LangGraph's `AsyncSqliteSaver` on one aiosqlite connection (what
  ``from_conn_string`` gives); events as INSERTs on a second aiosqlite connection to the
  same file; streams as one `asyncio.Queue` per run.

A fenced runstore stack (``--fenced``) fences each run's stores before its first write,
as a lease grant does (`runstore.fencing.fence_stores`), and every write of the run
carries the token; only the stores whose backend declares ``fencing`` take part
(`RunstoreStack.fenced_stores`). The stock stacks have no fences: their ``fence``
arguments are never given.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson

#: Stack name -> whether it is a stock peer.
STACKS = {"embedded": False, "pg+redis": False, "stock": True, "stock-sqlite": True}
#: The stock stack each runstore stack is compared with.
LOAD_PEERS = {"embedded": "stock-sqlite", "pg+redis": "stock"}
#: Stacks that need the PostgreSQL / Redis test servers.
NEEDS_POSTGRES = frozenset({"pg+redis", "stock"})
NEEDS_REDIS = frozenset({"pg+redis", "stock"})

#: A subscriber that sees nothing new for this long gives up (its events count as lost).
SUBSCRIBER_IDLE_SECONDS = 30.0

STOCK_EVENTS_TABLE = "bench_events"


def _event_rows(events: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """A turn's journal events as the stock stacks' INSERT parameters."""
    return [
        (
            e["thread_id"], e["run_id"], e["event_type"], e["category"], e["content"],
            orjson.dumps(e.get("metadata") or {}).decode(),
        )
        for e in events
    ]  # fmt: skip


class StreamBroken(Exception):
    """A subscriber got a gap, a duplicate or an out-of-order event."""


class Stack:
    """One worker process's view of a stack; see the module docstring."""

    name = ""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.saver: Any = None
        #: The kinds (``checkpointer``, ``events``, ``streams``) this stack fences.
        self.fenced_stores: tuple[str, ...] = ()
        self._stack = AsyncExitStack()
        #: Seconds callers spent acquiring pooled connections, and how many did.
        self.pool_wait_seconds = 0.0
        self.pool_wait_max_seconds = 0.0
        self.pool_checkouts = 0

    async def prepare(self) -> None:
        """Create the schema/tables once, before any worker opens the stack."""

    async def open(self) -> None:
        """Open the saver, the journal and the stream for this process."""

    async def fence_run(self, thread_id: str, run_id: str, fence: int) -> None:
        """Fence the run's stores with ``fence`` as a lease grant does (a fenced stack only)."""

    async def put_events(self, events: Sequence[Mapping[str, Any]], fence: int | None = None) -> None:
        """Append one turn's journal events (one thread, one batch), carrying ``fence``
        (a fenced stack's token; ``None``: unchecked)."""
        raise NotImplementedError

    async def publish(self, run_id: str, data: Mapping[str, Any], fence: int | None = None) -> None:
        """Publish one stream event of ``run_id``, carrying ``fence`` (as `put_events`)."""
        raise NotImplementedError

    async def publish_end(self, run_id: str, fence: int | None = None) -> None:
        """Mark ``run_id``'s stream finished, carrying ``fence`` (as `put_events`)."""
        raise NotImplementedError

    def subscribe(self, run_id: str) -> AsyncIterator[Mapping[str, Any]]:
        """The stream's event payloads from the first, until the end marker."""
        raise NotImplementedError

    async def finish_run(self, run_id: str) -> None:
        """Drop ``run_id``'s stream once its subscriber is done."""
        raise NotImplementedError

    async def read_feed(self, thread_id: str, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """``(seq or id, run_id, event_type, content)`` of the thread's journal, in order."""
        raise NotImplementedError

    def pool_stats(self) -> dict[str, Any]:
        """Pool waits measured so far (``None`` values where the stack has no pool)."""
        return {
            "pool_wait_ms": self.pool_wait_seconds * 1000.0,
            "pool_wait_max_ms": self.pool_wait_max_seconds * 1000.0,
            "pool_checkouts": self.pool_checkouts,
        }

    async def close(self) -> None:
        """Close what `open` opened."""
        await self._stack.aclose()

    async def teardown(self) -> None:
        """Remove what `prepare` created outside the case's work directory."""


# --------------------------------------------------------------------------- runstore


_WATCHED: list[RunstoreStack] = []
_ORIGINAL_DO_GET: Any = None


def _watch_sqlalchemy_pools(stack: RunstoreStack) -> None:
    """Time every checkout from SQLAlchemy's queue pools (how long a caller waited for a
    connection, opening one included) and add it to ``stack``'s pool waits, until
    `_unwatch` (the last one restores the pool class)."""
    global _ORIGINAL_DO_GET
    from sqlalchemy.pool import QueuePool

    _WATCHED.append(stack)
    if _ORIGINAL_DO_GET is not None:
        return
    original = _ORIGINAL_DO_GET = QueuePool._do_get

    def timed(self: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self)
        finally:
            spent = time.perf_counter() - started
            for watched in _WATCHED:
                watched.pool_wait_seconds += spent
                watched.pool_wait_max_seconds = max(watched.pool_wait_max_seconds, spent)
                watched.pool_checkouts += 1

    QueuePool._do_get = timed  # type: ignore[method-assign]


def _unwatch(stack: RunstoreStack) -> None:
    global _ORIGINAL_DO_GET
    from sqlalchemy.pool import QueuePool

    if stack in _WATCHED:
        _WATCHED.remove(stack)
    if not _WATCHED and _ORIGINAL_DO_GET is not None:
        QueuePool._do_get = _ORIGINAL_DO_GET  # type: ignore[method-assign]
        _ORIGINAL_DO_GET = None


class RunstoreStack(Stack):
    """``embedded`` and ``pg+redis``: `runstore.open` on the case's URLs."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.stores: Any = None

    def _config(self) -> dict[str, Any]:
        from runstore.bench.targets import merge_settings

        spec = self.spec
        config: dict[str, Any] = {
            "checkpointer": spec["database_url"],
            "events": spec["database_url"],
            "streams": spec["streams_url"],
            "checkpoint_channel_mode": spec["mode"],
            "postgres": {"pool_max_size": spec["pool_size"]},
        }
        return merge_settings(config, spec.get("settings") or {})

    async def prepare(self) -> None:
        import runstore

        # Opening applies the migrations; workers then find the schema current.
        async with runstore.open(self._config()):
            pass

    async def open(self) -> None:
        import runstore

        _watch_sqlalchemy_pools(self)
        self.stores = await self._stack.enter_async_context(runstore.open(self._config()))
        self.saver = self.stores.checkpointer
        if self.spec.get("fenced"):
            self.fenced_stores = fencing_kinds(self.spec)

    def _fence(self, kind: str, fence: int | None) -> int | None:
        """``fence`` if this stack fences ``kind``'s store, else ``None`` (unchecked)."""
        return fence if kind in self.fenced_stores else None

    async def fence_run(self, thread_id: str, run_id: str, fence: int) -> None:
        from runstore.fencing import FenceGrant, fence_stores

        stores = {"checkpointer": self.saver, "events": self.stores.events, "streams": self.stores.streams}
        await fence_stores(
            FenceGrant(thread_id, run_id, fence), [stores[k] for k in self.fenced_stores]
        )

    async def put_events(self, events: Sequence[Mapping[str, Any]], fence: int | None = None) -> None:
        await self.stores.events.put_batch(events, user_id=None, fence=self._fence("events", fence))

    async def publish(self, run_id: str, data: Mapping[str, Any], fence: int | None = None) -> None:
        await self.stores.streams.publish(run_id, "token", data, fence=self._fence("streams", fence))

    async def publish_end(self, run_id: str, fence: int | None = None) -> None:
        await self.stores.streams.publish_end(run_id, fence=self._fence("streams", fence))

    async def subscribe(self, run_id: str) -> AsyncIterator[Mapping[str, Any]]:
        from runstore.streams.protocol import END, StreamEvent, StreamGap

        items = self.stores.streams.subscribe(run_id, heartbeat_interval=SUBSCRIBER_IDLE_SECONDS)
        try:
            async for item in items:
                if item is END:
                    return
                if isinstance(item, StreamGap):
                    raise StreamBroken(f"stream gap on {run_id}: {item}")
                if isinstance(item, StreamEvent):
                    yield item.data
                else:  # a heartbeat: nothing arrived for SUBSCRIBER_IDLE_SECONDS
                    raise StreamBroken(f"no event on {run_id} for {SUBSCRIBER_IDLE_SECONDS:g}s")
        finally:
            await items.aclose()

    async def finish_run(self, run_id: str) -> None:
        await self.stores.streams.cleanup(run_id)

    async def read_feed(self, thread_id: str, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for run_id in run_ids:
            for rec in await self.stores.events.list_events(thread_id, run_id, user_id=None):
                out.append((rec["seq"], rec["run_id"], rec["event_type"], rec["content"]))
        return out

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            _unwatch(self)

    async def teardown(self) -> None:
        spec = self.spec
        if spec.get("pg_dsn") and spec.get("pg_schema"):
            from runstore.bench.targets import postgres_drop_schema

            await postgres_drop_schema(spec["pg_dsn"], spec["pg_schema"])
        if spec.get("redis_prefix"):
            await delete_redis_prefix(spec["redis_url"], spec["redis_prefix"])


# --------------------------------------------------------------------------- stock PostgreSQL + Redis


class StockPostgresStack(Stack):
    """``stock``: AsyncPostgresSaver on a psycopg pool, raw INSERTs, raw XADD/XREAD."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.pool: Any = None
        self.redis: Any = None

    def _conninfo(self) -> str:
        from psycopg.conninfo import make_conninfo

        return str(
            make_conninfo(self.spec["pg_dsn"], options=f"-c search_path={self.spec['pg_schema']}")
        )

    async def prepare(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        from runstore.bench.targets import postgres_create_schema

        await postgres_create_schema(self.spec["pg_dsn"], self.spec["pg_schema"])
        conn = await AsyncConnection.connect(
            self._conninfo(), autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        try:
            await AsyncPostgresSaver(conn=conn).setup()
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {STOCK_EVENTS_TABLE} ("
                "id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, run_id TEXT NOT NULL, "
                "event_type TEXT NOT NULL, category TEXT NOT NULL, content TEXT NOT NULL, "
                "metadata JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {STOCK_EVENTS_TABLE}_thread "
                f"ON {STOCK_EVENTS_TABLE} (thread_id, id)"
            )
        finally:
            await conn.close()

    async def open(self) -> None:
        import redis.asyncio as redis
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        size = int(self.spec["pool_size"])
        pool: Any = AsyncConnectionPool(
            self._conninfo(),
            min_size=size,
            max_size=size,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        await pool.open(wait=True)
        self._stack.push_async_callback(pool.close)
        self.pool = pool
        self.saver = AsyncPostgresSaver(conn=pool)
        # Room for one blocking XREAD and one publish per thread of this process
        # (redis-py refuses a checkout beyond max_connections, 100 by default).
        self.redis = redis.Redis.from_url(
            self.spec["redis_url"], max_connections=2 * len(self.spec.get("threads") or ()) + 16
        )
        self._stack.push_async_callback(self.redis.aclose)

    async def put_events(self, events: Sequence[Mapping[str, Any]], fence: int | None = None) -> None:
        rows = _event_rows(events)
        async with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.executemany(
                f"INSERT INTO {STOCK_EVENTS_TABLE} "
                "(thread_id, run_id, event_type, category, content, metadata) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                rows,
            )

    def _key(self, run_id: str) -> str:
        return f"{self.spec['redis_prefix']}stream:{run_id}"

    async def publish(self, run_id: str, data: Mapping[str, Any], fence: int | None = None) -> None:
        await self.redis.xadd(self._key(run_id), {"d": orjson.dumps(data)})

    async def publish_end(self, run_id: str, fence: int | None = None) -> None:
        await self.redis.xadd(self._key(run_id), {"end": 1})

    async def subscribe(self, run_id: str) -> AsyncIterator[Mapping[str, Any]]:
        key = self._key(run_id)
        last = "0-0"
        idle_since = time.monotonic()
        while True:
            # Blocks for less than redis-py's socket timeout (5 s by default).
            reply: Any = await self.redis.xread({key: last}, block=1000, count=100)
            if not reply:
                if time.monotonic() - idle_since > SUBSCRIBER_IDLE_SECONDS:
                    raise StreamBroken(f"no event on {run_id} for {SUBSCRIBER_IDLE_SECONDS:g}s")
                continue
            idle_since = time.monotonic()
            for _stream, entries in reply:
                for entry_id, fields in entries:
                    last = entry_id
                    if b"end" in fields:
                        return
                    yield orjson.loads(fields[b"d"])

    async def finish_run(self, run_id: str) -> None:
        await self.redis.delete(self._key(run_id))

    async def read_feed(self, thread_id: str, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT id, run_id, event_type, content FROM {STOCK_EVENTS_TABLE} "
                "WHERE thread_id = %s ORDER BY id",
                (thread_id,),
            )
            rows = await cur.fetchall()
        return [(r["id"], r["run_id"], r["event_type"], r["content"]) for r in rows]

    def pool_stats(self) -> dict[str, Any]:
        stats = self.pool.get_stats() if self.pool is not None else {}
        return {
            "pool_wait_ms": float(stats.get("requests_wait_ms", 0)),
            "pool_wait_max_ms": None,
            "pool_checkouts": int(stats.get("requests_num", 0)),
            "pool_queued": int(stats.get("requests_queued", 0)),
            "pool_errors": int(stats.get("requests_errors", 0)),
        }

    async def teardown(self) -> None:
        from runstore.bench.targets import postgres_drop_schema

        await postgres_drop_schema(self.spec["pg_dsn"], self.spec["pg_schema"])
        await delete_redis_prefix(self.spec["redis_url"], self.spec["redis_prefix"])


# --------------------------------------------------------------------------- stock sqlite


class StockSqliteStack(Stack):
    """``stock-sqlite``: AsyncSqliteSaver on one connection, raw INSERTs, asyncio queues."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.events_conn: Any = None
        self._events_lock = asyncio.Lock()
        self._queues: dict[str, asyncio.Queue[Any]] = {}

    @property
    def path(self) -> str:
        return str(Path(self.spec["work_dir"]) / "stock.db")

    async def prepare(self) -> None:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        await asyncio.to_thread(Path(self.spec["work_dir"]).mkdir, parents=True, exist_ok=True)
        async with aiosqlite.connect(self.path) as conn:
            await AsyncSqliteSaver(conn).setup()
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {STOCK_EVENTS_TABLE} ("
                "id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, "
                "run_id TEXT NOT NULL, event_type TEXT NOT NULL, category TEXT NOT NULL, "
                "content TEXT NOT NULL, metadata TEXT NOT NULL, "
                "created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
            )
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {STOCK_EVENTS_TABLE}_thread "
                f"ON {STOCK_EVENTS_TABLE} (thread_id, id)"
            )
            await conn.commit()

    async def open(self) -> None:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        conn = await aiosqlite.connect(self.path)
        self._stack.push_async_callback(conn.close)
        self.saver = AsyncSqliteSaver(conn)
        self.events_conn = await aiosqlite.connect(self.path)
        self._stack.push_async_callback(self.events_conn.close)

    async def put_events(self, events: Sequence[Mapping[str, Any]], fence: int | None = None) -> None:
        rows = _event_rows(events)
        # One connection serves every coroutine: a lock keeps each batch one transaction.
        async with self._events_lock:
            await self.events_conn.executemany(
                f"INSERT INTO {STOCK_EVENTS_TABLE} "
                "(thread_id, run_id, event_type, category, content, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            await self.events_conn.commit()

    def _queue(self, run_id: str) -> asyncio.Queue[Any]:
        queue = self._queues.get(run_id)
        if queue is None:
            queue = self._queues[run_id] = asyncio.Queue()
        return queue

    async def publish(self, run_id: str, data: Mapping[str, Any], fence: int | None = None) -> None:
        self._queue(run_id).put_nowait(data)

    async def publish_end(self, run_id: str, fence: int | None = None) -> None:
        self._queue(run_id).put_nowait(None)

    async def subscribe(self, run_id: str) -> AsyncIterator[Mapping[str, Any]]:
        queue = self._queue(run_id)
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), SUBSCRIBER_IDLE_SECONDS)
            except TimeoutError:
                raise StreamBroken(
                    f"no event on {run_id} for {SUBSCRIBER_IDLE_SECONDS:g}s"
                ) from None
            if item is None:
                return
            yield item

    async def finish_run(self, run_id: str) -> None:
        self._queues.pop(run_id, None)

    async def read_feed(self, thread_id: str, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
        cur = await self.events_conn.execute(
            f"SELECT id, run_id, event_type, content FROM {STOCK_EVENTS_TABLE} "
            "WHERE thread_id = ? ORDER BY id",
            (thread_id,),
        )
        return [tuple(r) for r in await cur.fetchall()]

    def pool_stats(self) -> dict[str, Any]:
        return {"pool_wait_ms": None, "pool_wait_max_ms": None, "pool_checkouts": None}


def make_stack(spec: Mapping[str, Any]) -> Stack:
    """The `Stack` of ``spec["stack"]``."""
    name = spec["stack"]
    if name in ("embedded", "pg+redis"):
        return RunstoreStack(spec)
    if name == "stock":
        return StockPostgresStack(spec)
    if name == "stock-sqlite":
        return StockSqliteStack(spec)
    raise ValueError(f"unknown load stack {name!r}; known: {', '.join(STACKS)}")


def stack_spec(
    case: Mapping[str, Any], *, postgres_url: str | None, redis_url: str | None
) -> dict[str, Any]:
    """Everything a worker needs to open the case's stack on fresh storage."""
    import uuid

    from runstore.bench.targets import fresh_schema, postgres_dsn
    from runstore.urls import BackendURL

    name = case["stack"]
    work_dir = Path(case["work_dir"]).resolve()
    spec: dict[str, Any] = {
        "stack": name,
        "mode": case["mode"],
        "pool_size": case["pool_size"],
        "settings": case.get("settings") or {},
        "work_dir": str(work_dir),
        "fenced": bool(case.get("fenced")),
    }
    if name in NEEDS_POSTGRES:
        if not postgres_url:
            raise ValueError(f"stack {name!r} needs a PostgreSQL server (--postgres-url)")
        url = BackendURL.parse(postgres_url)
        spec["pg_dsn"] = postgres_dsn(url)
        spec["pg_schema"] = fresh_schema("rsbench_load")
        spec["database_url"] = url.with_query(schema=spec["pg_schema"]).render(hide_password=False)
    if name in NEEDS_REDIS:
        if not redis_url:
            raise ValueError(f"stack {name!r} needs a Redis server (--redis-url)")
        raw = BackendURL.parse(redis_url).without_query("prefix")
        spec["redis_url"] = raw.render(hide_password=False)
        spec["redis_prefix"] = f"rsbench:{uuid.uuid4().hex[:10]}:"
        spec["streams_url"] = raw.with_query(prefix=spec["redis_prefix"]).render(hide_password=False)
    if name == "embedded":
        spec["database_url"] = BackendURL.for_file("sqlite", work_dir / "runstore.db").render(
            hide_password=False
        )
        spec["streams_url"] = "memory://"
    return spec


def fencing_kinds(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of a runstore stack whose backend declares ``fencing`` (the ones a fenced
    case fences), in `runstore.fencing.fence_stores` order: saver, event store, bridge."""
    from runstore.loader import get_backends

    backends = get_backends()
    urls = (
        ("checkpointer", backends.savers, spec["database_url"]),
        ("events", backends.events, spec["database_url"]),
        ("streams", backends.streams, spec["streams_url"]),
    )
    return tuple(kind for kind, registry, url in urls if registry.for_url(url).has("fencing"))


async def delete_redis_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (cleanup, best effort)."""
    from runstore.bench.targets import redis_delete_prefix

    with contextlib.suppress(Exception):
        await redis_delete_prefix(redis_url, prefix)
